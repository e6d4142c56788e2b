"""ClientShareCheck: checks on the ShareRelay, then the ShareReceipt."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from secagg.client import ClientAborted, ClientMaskedInputCollection
from secagg.errors import AbortReason
from secagg.messages import KeyList, ShareReceipt
from stage_setup import assert_client_aborted, ill_typed, share_relays


def test_all_shares_open_and_the_receipt_is_empty() -> None:
    h, relays = share_relays()
    state, (msg,) = h.clients[0].handle(relays[0])
    assert isinstance(state, ClientMaskedInputCollection) and isinstance(msg, ShareReceipt)
    assert msg.undecryptable == ()
    assert sorted(state._round.held) == [1, 2, 3, 4]
    assert state._round.encoded_input is not None  # nothing is masked before the MaskingRequest


def test_a_tampered_blob_is_reported_and_not_held() -> None:
    h, relays = share_relays()
    shares = list(relays[0].shares)
    sender, blob = shares[1]
    shares[1] = (sender, blob[:-1] + bytes([blob[-1] ^ 1]))
    state, (msg,) = h.clients[0].handle(dataclasses.replace(relays[0], shares=tuple(shares)))
    assert isinstance(state, ClientMaskedInputCollection) and isinstance(msg, ShareReceipt)
    assert msg.undecryptable == (sender,)
    assert sender not in state._round.held and sender in state._round.undecryptable


def test_a_blob_meant_for_another_device_fails_its_associated_data() -> None:
    h, relays = share_relays()
    shares = list(relays[0].shares)  # from 1, 2, 3, 4
    other = dict(relays[3].shares)[1]  # 1's blob for device 3
    shares[0] = (1, other)
    _, (msg,) = h.clients[0].handle(dataclasses.replace(relays[0], shares=tuple(shares)))
    assert isinstance(msg, ShareReceipt)
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
    assert isinstance(msg, ShareReceipt)
    assert msg.undecryptable == (shares[2][0],)


def test_relay_from_another_round_is_refused() -> None:
    h, relays = share_relays()
    state, out = h.clients[0].handle(dataclasses.replace(relays[0], round_idx=1))
    assert isinstance(state, ClientAborted) and state.reason is AbortReason.WRONG_SESSION_OR_ROUND


def test_wrong_message_type() -> None:
    h, _ = share_relays()
    state, _ = h.clients[0].handle(KeyList(session_id=h.config.session_id, round_idx=0, device_id=0, entries=()))
    assert isinstance(state, ClientAborted) and state.reason is AbortReason.UNEXPECTED_MESSAGE


