"""ClientMaskedInputCollection: checks on the ShareRelay, then y_v."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from secagg.client import ClientAborted, ClientConsistencyCheck, ClientUnmasking
from secagg.errors import AbortReason
from secagg.keys import agree, pairwise_mask_key, self_mask_key
from secagg.messages import KeyList, MaskedInput
from stage_setup import assert_client_aborted, ill_typed, share_relays


def _aes_ctr_words(key: bytes, length: int) -> np.ndarray:
    e = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
    return np.frombuffer(e.update(bytes(4 * length)), dtype="<u4").astype(np.int64)


def test_masked_input_is_x_plus_exactly_the_documented_masks() -> None:
    h, relays = share_relays()
    v, L, sid = 2, h.config.vector_length, h.config.session_id
    rnd = h.clients[v]._round
    state, (msg,) = h.clients[v].handle(relays[v])
    assert isinstance(state, ClientUnmasking) and isinstance(msg, MaskedInput)
    assert msg.vector.dtype == np.uint32 and msg.vector.shape == (L,) and msg.undecryptable == ()
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
    h, relays = share_relays()
    total = np.zeros(h.config.vector_length, dtype=np.uint32)
    self_masks = np.zeros_like(total)
    for v in range(5):
        h.clients[v], (msg,) = h.clients[v].handle(relays[v])
        assert isinstance(msg, MaskedInput)
        total += msg.vector
        key = self_mask_key(h.clients[v]._round.b_seed, session_id=h.config.session_id, round_idx=0, owner=v)
        self_masks += _aes_ctr_words(key, h.config.vector_length).astype(np.uint32)
    np.testing.assert_array_equal(total - self_masks, h.encoded.sum(axis=0, dtype=np.uint32))


def test_a_tampered_blob_is_reported_and_masks_are_unchanged() -> None:
    h, relays = share_relays()
    honest, honest_relays = share_relays()
    _, (good,) = honest.clients[0].handle(honest_relays[0])
    assert isinstance(good, MaskedInput)
    shares = list(relays[0].shares)
    sender, blob = shares[1]
    shares[1] = (sender, blob[:-1] + bytes([blob[-1] ^ 1]))
    state, (msg,) = h.clients[0].handle(dataclasses.replace(relays[0], shares=tuple(shares)))
    assert isinstance(state, ClientUnmasking) and isinstance(msg, MaskedInput)
    assert msg.undecryptable == (sender,)
    np.testing.assert_array_equal(msg.vector, good.vector)
    assert sender not in state._round.held


def test_a_blob_meant_for_another_device_fails_its_associated_data() -> None:
    h, relays = share_relays()
    shares = list(relays[0].shares)  # from 1, 2, 3, 4
    other = dict(relays[3].shares)[1]  # 1's blob for device 3
    shares[0] = (1, other)
    _, (msg,) = h.clients[0].handle(dataclasses.replace(relays[0], shares=tuple(shares)))
    assert isinstance(msg, MaskedInput)
    assert msg.undecryptable == (1,)


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda s: s + [s[0]], id="duplicate-sender"),
        pytest.param(lambda s: s + [(0, s[0][1])], id="self-as-sender"),
        pytest.param(lambda s: s + [(17, s[0][1])], id="unknown-sender"),
        pytest.param(lambda s: s[:1], id="fewer-than-t"),
        pytest.param(lambda s: s + ["junk"], id="junk-entry"),
    ],
)
def test_invalid_relays_abort(mutate: Callable[[list[Any]], list[Any]]) -> None:
    h, relays = share_relays()
    bad = dataclasses.replace(relays[0], shares=tuple(mutate(list(relays[0].shares))))
    state, out = h.clients[0].handle(bad)
    assert_client_aborted(state, out, AbortReason.INVALID_SHARE_RELAY)


def test_a_non_bytes_blob_counts_as_undecryptable() -> None:
    h, relays = share_relays()
    shares = list(relays[0].shares)
    shares[2] = (shares[2][0], ill_typed(12345))
    _, (msg,) = h.clients[0].handle(dataclasses.replace(relays[0], shares=tuple(shares)))
    assert isinstance(msg, MaskedInput)
    assert msg.undecryptable == (shares[2][0],)


def test_relay_from_another_round_is_refused() -> None:
    h, relays = share_relays()
    state, out = h.clients[0].handle(dataclasses.replace(relays[0], round_idx=1))
    assert isinstance(state, ClientAborted) and state.reason is AbortReason.WRONG_SESSION_OR_ROUND


def test_wrong_message_type() -> None:
    h, _ = share_relays()
    state, _ = h.clients[0].handle(KeyList(session_id=h.config.session_id, round_idx=0, device_id=0, entries=()))
    assert isinstance(state, ClientAborted) and state.reason is AbortReason.UNEXPECTED_MESSAGE


def test_active_mode_goes_to_consistency_check() -> None:
    h, relays = share_relays(active_adversary=True)
    state, _ = h.clients[0].handle(relays[0])
    assert isinstance(state, ClientConsistencyCheck)
