"""ClientMaskedInputCollection: checks on the MaskingRequest, then y_v."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from secagg.client import ClientConsistencyCheck, ClientUnmasking
from secagg.errors import AbortReason
from secagg.keys import agree, pairwise_mask_key, self_mask_key
from secagg.messages import MaskedInput
from stage_setup import assert_client_aborted, masking_requests


def _aes_ctr_words(key: bytes, length: int) -> np.ndarray:
    e = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
    return np.frombuffer(e.update(bytes(4 * length)), dtype="<u4").astype(np.int64)


def test_masked_input_is_x_plus_exactly_the_documented_masks() -> None:
    h, requests = masking_requests()
    v, L, sid = 2, h.config.vector_length, h.config.session_id
    rnd = h.clients[v]._round
    state, (msg,) = h.clients[v].handle(requests[v])
    assert isinstance(state, ClientUnmasking) and isinstance(msg, MaskedInput)
    assert msg.vector.dtype == np.uint32 and msg.vector.shape == (L,)
    expected = h.encoded[v].astype(np.int64)
    expected += _aes_ctr_words(self_mask_key(rnd.b_seed, session_id=sid, round_idx=0, owner=v), L)
    for u in range(5):
        if u == v:
            continue
        peer_s = h.clients[u]._round.s_keys().public
        key = pairwise_mask_key(agree(rnd.s_keys().private, peer_s), session_id=sid, round_idx=0, a=v, b=u)
        expected += (1 if v < u else -1) * _aes_ctr_words(key, L)
    np.testing.assert_array_equal(msg.vector, (expected % 2**32).astype(np.uint32))


def test_pair_masks_cancel_in_the_sum() -> None:
    h, requests = masking_requests()
    total = np.zeros(h.config.vector_length, dtype=np.uint32)
    self_masks = np.zeros_like(total)
    for v in range(5):
        h.clients[v], (msg,) = h.clients[v].handle(requests[v])
        assert isinstance(msg, MaskedInput)
        total += msg.vector
        key = self_mask_key(h.clients[v]._round.b_seed, session_id=h.config.session_id, round_idx=0, owner=v)
        self_masks += _aes_ctr_words(key, h.config.vector_length).astype(np.uint32)
    np.testing.assert_array_equal(total - self_masks, h.encoded.sum(axis=0, dtype=np.uint32))


def test_masks_only_with_the_named_peers() -> None:
    h, requests = masking_requests()
    v, L, sid = 2, h.config.vector_length, h.config.session_id
    rnd = h.clients[v]._round
    named = (0, 3, 4)  # the server left device 1 out (say, a report against the pair)
    state, (msg,) = h.clients[v].handle(dataclasses.replace(requests[v], peers=named))
    assert isinstance(state, ClientUnmasking) and isinstance(msg, MaskedInput)
    assert state._round.masked_with == frozenset(named)
    expected = h.encoded[v].astype(np.int64)
    expected += _aes_ctr_words(self_mask_key(rnd.b_seed, session_id=sid, round_idx=0, owner=v), L)
    for u in named:
        peer_s = h.clients[u]._round.s_keys().public
        key = pairwise_mask_key(agree(rnd.s_keys().private, peer_s), session_id=sid, round_idx=0, a=v, b=u)
        expected += (1 if v < u else -1) * _aes_ctr_words(key, L)
    np.testing.assert_array_equal(msg.vector, (expected % 2**32).astype(np.uint32))


@pytest.mark.parametrize(
    "peers",
    [
        pytest.param((1, 1, 3), id="duplicate"),
        pytest.param((1, 3, 17), id="unknown-id"),
        pytest.param((1, 2, 3), id="itself"),
        pytest.param((1,), id="fewer-than-t"),
        pytest.param("junk", id="not-a-list"),
    ],
)
def test_invalid_masking_requests_abort(peers: Any) -> None:
    h, requests = masking_requests()
    state, out = h.clients[2].handle(dataclasses.replace(requests[2], peers=peers))
    assert_client_aborted(state, out, AbortReason.INVALID_MASKING_REQUEST)


def test_a_peer_the_device_reported_may_not_be_named() -> None:
    h, requests = masking_requests()
    rnd = h.clients[2]._round
    rnd.undecryptable = frozenset({3})  # as if 3's shares had not opened here
    state, out = h.clients[2].handle(requests[2])
    assert_client_aborted(state, out, AbortReason.INVALID_MASKING_REQUEST)


def test_active_mode_goes_to_consistency_check() -> None:
    h, requests = masking_requests(active_adversary=True)
    state, _ = h.clients[0].handle(requests[0])
    assert isinstance(state, ClientConsistencyCheck)
