"""ServerShareKeys: validate each device's sealed shares and relay them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from secagg.errors import AbortReason, DropReason
from secagg.messages import ShareKeys, ShareRelay
from secagg.server import ServerShareCheck
from secagg.testing import StepHarness
from stage_setup import close_typed, close_with_only, key_lists, server_aborted, shared_keys


def test_relays_each_blob_to_its_receiver_unchanged() -> None:
    h, sk = shared_keys()
    for i, m in sk.items():
        h.server, _ = h.server.handle(i, m)
    out = close_typed(h, ShareRelay)
    assert isinstance(h.server, ServerShareCheck)
    for v, relay in out.items():
        assert [u for u, _ in relay.shares] == [u for u in range(5) if u != v]
        for u, blob in relay.shares:
            assert blob == dict(sk[u].shares)[v]
    assert h.server.record.relayed[2] == frozenset({0, 1, 3, 4})


def _dropped(
    h: StepHarness,
    sk: dict[int, ShareKeys],
    sender: int,
    msg: ShareKeys,
    reason: DropReason = DropReason.MALFORMED_MESSAGE,
) -> dict[int, ShareRelay]:
    for i, m in sk.items():
        h.server, _ = h.server.handle(sender if i == sender else i, msg if i == sender else m)
    assert h.server.record.dropped[sender] == ("share_keys", reason)
    out = close_typed(h, ShareRelay)
    assert sender not in out
    assert all(sender not in dict(r.shares) for r in out.values())
    return out


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda s: s[1:], id="missing-receiver"),
        pytest.param(lambda s: s + [s[0]], id="duplicate-share"),
        pytest.param(lambda s: s[:-1] + [(9, s[-1][1])], id="unknown-receiver"),
        pytest.param(lambda s: s[:-1] + [(s[-1][0], s[-1][1][:-1])], id="short-blob"),
        pytest.param(lambda s: s[:-1] + [(s[-1][0], "text")], id="not-bytes"),
        pytest.param(lambda s: s + ["junk"], id="junk"),
    ],
)
def test_malformed_share_messages_drop_the_sender(mutate: Callable[[list[Any]], list[Any]]) -> None:
    h, sk = shared_keys()
    bad = dataclasses.replace(sk[1], shares=tuple(mutate(list(sk[1].shares))))
    out = _dropped(h, sk, 1, bad)
    assert len(out) == 4


def test_self_addressed_share_is_unknown_receiver() -> None:
    h, sk = shared_keys()
    shares = list(sk[1].shares)
    shares[0] = (1, shares[0][1])
    _dropped(h, sk, 1, dataclasses.replace(sk[1], shares=tuple(shares)))


def test_replay_from_another_round_drops_the_sender() -> None:
    h, sk = shared_keys()
    _dropped(h, sk, 3, dataclasses.replace(sk[3], round_idx=7), DropReason.WRONG_SESSION_OR_ROUND)


def test_a_device_that_did_not_advertise_is_ignored() -> None:
    h, keylists = key_lists(drop={"advertise_keys": [4]})
    _, other_sk = shared_keys()
    h.server, _ = h.server.handle(4, other_sk[4])
    assert 4 not in h.server.record.dropped or h.server.record.dropped[4][0] != "share_keys"
    assert h.server.record.rejections[-1].device_id == 4
    assert 4 not in keylists


def test_too_few_shared_aborts() -> None:
    h, sk = shared_keys()
    out = close_with_only(h, sk, (0, 1))
    server_aborted(h.server, AbortReason.TOO_FEW_SHARED)
    assert {m.device_id for m in out} == set(range(5))
