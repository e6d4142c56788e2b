"""ServerAdvertiseKeys: collect keys, drop misbehaving devices, send KeyLists."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from secagg.errors import AbortReason, DropReason, ProtocolMisuse
from secagg.messages import AdvertiseKeys, ClientAbort, KeyList, MaskedInput, Message, ServerAbort
from secagg.server import ServerAborted, ServerAdvertiseKeys, ServerShareKeys
from secagg.testing import StepHarness
from stage_setup import adverts, close_typed, close_with_only, harness, ill_typed, server_aborted


def test_key_lists_carry_every_advertised_closure_member() -> None:
    h, adv = adverts()
    for i, m in adv.items():
        h.server, replies = h.server.handle(i, m)
        assert replies == []
    assert h.server.pending == frozenset()
    out = close_typed(h, KeyList)
    assert isinstance(h.server, ServerShareKeys)
    assert sorted(out) == [0, 1, 2, 3, 4]
    kl = out[3]
    assert kl.device_id == 3
    assert [(e.device_id, e.c_public, e.s_public) for e in kl.entries] == [
        (i, adv[i].c_public, adv[i].s_public) for i in range(5)
    ]
    assert h.server.record.survivors["advertise_keys"] == (0, 1, 2, 3, 4)


def _drop_case(
    h: StepHarness, adv: dict[int, AdvertiseKeys], sender: int, msg: Message, reason: DropReason
) -> None:
    for i, m in adv.items():
        if i != sender:
            h.server, _ = h.server.handle(i, m)
    h.server, _ = h.server.handle(sender, msg)
    assert h.server.record.dropped[sender] == ("advertise_keys", reason)
    out = close_typed(h, KeyList)
    assert sender not in out and len(out) == 4  # the round goes on without it
    assert all(sender not in {e.device_id for e in kl.entries} for kl in out.values())


@pytest.mark.parametrize(
    "change,reason",
    [
        ({"round_idx": 1}, DropReason.WRONG_SESSION_OR_ROUND),
        ({"session_id": b"another"}, DropReason.WRONG_SESSION_OR_ROUND),
        ({"device_id": 0}, DropReason.SPOOFED_SENDER),
        ({"c_public": b"c" * 31}, DropReason.MALFORMED_MESSAGE),
        ({"c_public": bytes(32)}, DropReason.MALFORMED_MESSAGE),  # low order
        ({"s_public": None}, DropReason.MALFORMED_MESSAGE),
        ({"signature": b"s" * 64}, DropReason.MALFORMED_MESSAGE),  # passive mode
    ],
)
def test_misbehaving_device_is_dropped(change: dict[str, Any], reason: DropReason) -> None:
    h, adv = adverts()
    _drop_case(h, adv, 2, dataclasses.replace(adv[2], **change), reason)


def test_equal_c_and_s_keys_are_dropped() -> None:
    h, adv = adverts()
    _drop_case(h, adv, 2, dataclasses.replace(adv[2], s_public=adv[2].c_public), DropReason.MALFORMED_MESSAGE)


def test_wrong_message_type_is_dropped() -> None:
    h, adv = adverts()
    mi = MaskedInput(session_id=h.config.session_id, round_idx=0, device_id=2, vector=np.zeros(8, np.uint32))
    _drop_case(h, adv, 2, mi, DropReason.UNEXPECTED_MESSAGE)


def test_client_abort_drops_the_device() -> None:
    h, adv = adverts()
    abort = ClientAbort(session_id=h.config.session_id, round_idx=0, device_id=2, reason=AbortReason.CANCELLED)
    _drop_case(h, adv, 2, abort, DropReason.CLIENT_ABORTED)


def test_a_duplicate_is_ignored_and_the_first_stands() -> None:
    h, adv = adverts()
    _, other = adverts()
    h.server, _ = h.server.handle(1, adv[1])
    h.server, _ = h.server.handle(1, other[1])
    assert 1 not in h.server.record.dropped
    assert h.server.record.rejections[-1].reason is DropReason.DUPLICATE_MESSAGE
    assert h.server.record.advertised[1] is adv[1]


def test_active_mode_drops_bad_signatures() -> None:
    h, adv = adverts(active_adversary=True)
    _drop_case(h, adv, 4, dataclasses.replace(adv[4], signature=adv[3].signature), DropReason.INVALID_SIGNATURE)


def test_too_few_advertised_aborts_and_tells_the_others() -> None:
    h, adv = adverts()  # t = 3
    out = close_with_only(h, adv, (0, 1))
    server_aborted(h.server, AbortReason.TOO_FEW_ADVERTISED)
    # Every cohort device not dropped for cause hears of it (2..4 may only be slow).
    notices = [m for m in out if isinstance(m, ServerAbort)]
    assert len(notices) == len(out)
    assert [(m.device_id, m.reason) for m in notices] == [(i, AbortReason.TOO_FEW_ADVERTISED) for i in range(5)]


def test_harary_devices_with_a_thin_neighbourhood_are_pruned() -> None:
    h, adv = adverts(n=12, neighbors=2, threshold=3)  # closure of 3: all three needed
    g = h.config.graph(0)
    silent = 0
    for i, m in adv.items():
        if i != silent:
            h.server, _ = h.server.handle(i, m)
    out = h.close()
    key_lists = {v for v, m in out.items() if isinstance(m, KeyList)}
    pruned = {v for v, m in out.items() if isinstance(m, ServerAbort)}
    # Both ring neighbours of the silent device lose a closure member, and the
    # loss cascades around the ring: nobody is left, so the round aborts.
    assert set(g.neighbors(silent)) <= pruned
    assert not key_lists and isinstance(h.server, ServerAborted)
    for v in pruned - {silent}:
        assert h.server.record.dropped[v] == ("advertise_keys", DropReason.NEIGHBOURHOOD_TOO_SMALL)


def test_caller_misuse() -> None:
    h, adv = adverts()
    with pytest.raises(TypeError):
        h.server.handle(0, ill_typed(b"bytes"))
    with pytest.raises(ProtocolMisuse):
        h.server.handle(5, adv[0])
    with pytest.raises(ProtocolMisuse):
        h.server.handle(ill_typed("0"), adv[0])
    state = h.server
    state.close()
    with pytest.raises(ProtocolMisuse):
        state.close()
    with pytest.raises(ProtocolMisuse):
        state.handle(0, adv[0])
    with pytest.raises(ValueError):
        ServerAdvertiseKeys(h.config, -1)
    with pytest.raises(TypeError):
        ServerAdvertiseKeys(ill_typed("config"), 0)


def test_active_mode_needs_identity_keys() -> None:
    h = harness(4, active_adversary=True)
    with pytest.raises(ProtocolMisuse):
        ServerAdvertiseKeys(h.config, 0)


def test_server_can_cancel() -> None:
    h, adv = adverts()
    h.server, _ = h.server.handle(0, adv[0])
    state, out = h.server.abort()
    assert isinstance(state, ServerAborted) and state.reason is AbortReason.CANCELLED
    assert [m.device_id for m in out] == [0, 1, 2, 3, 4]
