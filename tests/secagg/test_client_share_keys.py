"""ClientShareKeys: checks on the KeyList, then sealed shares to each peer."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from secagg import shamir
from secagg.aead import open_sealed, share_associated_data
from secagg.client import ClientAborted, ClientShareCheck, ClientShareKeys
from secagg.errors import AbortReason, ProtocolMisuse
from secagg.keys import agree, share_key
from secagg.messages import KeyEntry, KeyList, ServerAbort, ShareKeys, ShareRelay
from stage_setup import assert_client_aborted, key_lists


def test_sends_one_sealed_share_pair_to_each_peer_that_only_it_can_open() -> None:
    h, keylists = key_lists()
    state, (msg,) = h.clients[0].handle(keylists[0])
    assert isinstance(state, ClientShareCheck) and isinstance(msg, ShareKeys)
    assert [r for r, _ in msg.shares] == [1, 2, 3, 4]
    assert all(len(blob) == 94 for _, blob in msg.shares)
    # Device 2 opens its blob with its own c-key and 0's advertised c-key.
    c2 = h.clients[2]._round.c_keys().private
    c0_pub = keylists[2].entries[0].c_public
    key = share_key(agree(c2, c0_pub), session_id=h.config.session_id, round_idx=0, sender=0, receiver=2)
    plaintext = open_sealed(key, dict(msg.shares)[2], share_associated_data(h.config.session_id, 0, 0, 2))
    assert len(plaintext) == 2 * shamir.ELEMENT_BYTES


def test_shares_reconstruct_b_and_s() -> None:
    h, keylists = key_lists()
    replies = h.deliver(keylists)
    h.send(replies)
    relays = h.close()
    for v, relay in relays.items():
        h.clients[v], _ = h.clients[v].handle(relay)
    owner = 1
    holders = [v for v in range(5) if v != owner][: h.config.threshold]
    xs = [shamir.x_of(v) for v in holders]
    b = shamir.combine(xs, [h.clients[v]._round.held[owner][0] for v in holders])
    s = shamir.combine(xs, [h.clients[v]._round.held[owner][1] for v in holders])
    assert shamir.int_to_secret(b) == h.clients[owner]._round.b_seed
    assert shamir.int_to_secret(s) == h.clients[owner]._round.s_keys().private_bytes()


def _with_entries(msg: KeyList, entries: Iterable[Any]) -> KeyList:
    return dataclasses.replace(msg, entries=tuple(entries))


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda e: e[1:], id="own-entry-missing"),
        pytest.param(lambda e: [KeyEntry(0, e[1].c_public, e[0].s_public)] + e[1:], id="own-keys-altered"),
        pytest.param(lambda e: e + [e[1]], id="duplicate-entry"),
        pytest.param(lambda e: e[:2], id="fewer-than-t"),
        pytest.param(lambda e: e[:-1] + [KeyEntry(4, e[0].c_public, e[4].s_public)], id="reflected-own-key"),
        pytest.param(lambda e: e[:-1] + [KeyEntry(4, bytes(32), e[4].s_public)], id="low-order-key"),
        pytest.param(lambda e: e[:-1] + [KeyEntry(4, b"x" * 31, e[4].s_public)], id="short-key"),
        pytest.param(lambda e: e + [KeyEntry(9, b"a" * 32, b"b" * 32)], id="unknown-id"),
        pytest.param(lambda e: e + ["not an entry"], id="not-an-entry"),
    ],
)
def test_invalid_key_lists_abort(mutate: Callable[[list[Any]], list[Any]]) -> None:
    h, keylists = key_lists()
    bad = _with_entries(keylists[0], mutate(list(keylists[0].entries)))
    state, out = h.clients[0].handle(bad)
    assert_client_aborted(state, out, AbortReason.INVALID_KEY_LIST)


def test_non_neighbour_in_a_harary_key_list_is_refused() -> None:
    h, keylists = key_lists(n=10, neighbors=4)
    v = 0
    outsider = next(u for u in range(10) if u not in h.config.graph(0).closure(v))
    entries = list(keylists[v].entries) + [KeyEntry(outsider, b"a" * 32, b"b" * 32)]
    state, out = h.clients[v].handle(_with_entries(keylists[v], entries))
    assert_client_aborted(state, out, AbortReason.INVALID_KEY_LIST)


@pytest.mark.parametrize(
    "change,reason",
    [
        ({"round_idx": 1}, AbortReason.WRONG_SESSION_OR_ROUND),
        ({"session_id": b"other"}, AbortReason.WRONG_SESSION_OR_ROUND),
        ({"device_id": 1}, AbortReason.MALFORMED_MESSAGE),
    ],
)
def test_replayed_or_misaddressed_key_list(change: dict[str, Any], reason: AbortReason) -> None:
    h, keylists = key_lists()
    state, out = h.clients[0].handle(dataclasses.replace(keylists[0], **change))
    assert_client_aborted(state, out, reason)


def test_wrong_message_type() -> None:
    h, _ = key_lists()
    relay = ShareRelay(session_id=h.config.session_id, round_idx=0, device_id=0, shares=())
    state, out = h.clients[0].handle(relay)
    assert_client_aborted(state, out, AbortReason.UNEXPECTED_MESSAGE)


def test_server_abort() -> None:
    h, _ = key_lists()
    state, out = h.clients[0].handle(
        ServerAbort(session_id=h.config.session_id, round_idx=0, device_id=0, reason=AbortReason.TOO_FEW_ADVERTISED)
    )
    assert isinstance(state, ClientAborted) and state.reason is AbortReason.SERVER_ABORTED and out == []


def test_spent_state_is_misuse() -> None:
    h, keylists = key_lists()
    state = h.clients[0]
    assert isinstance(state, ClientShareKeys)
    state.handle(keylists[0])
    with pytest.raises(ProtocolMisuse):
        state.handle(keylists[0])


def test_active_mode_refuses_a_forged_key_signature() -> None:
    h, keylists = key_lists(active_adversary=True)
    entries = list(keylists[0].entries)
    entries[2] = dataclasses.replace(entries[2], signature=entries[3].signature)
    state, out = h.clients[0].handle(_with_entries(keylists[0], entries))
    assert_client_aborted(state, out, AbortReason.INVALID_SIGNATURE)


def test_active_mode_accepts_genuine_signatures() -> None:
    h, keylists = key_lists(active_adversary=True)
    state, _ = h.clients[0].handle(keylists[0])
    assert isinstance(state, ClientShareCheck)
