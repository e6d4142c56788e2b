"""ServerShareKeys: validate each device's sealed shares and relay them."""

from __future__ import annotations

import dataclasses

import pytest

from secagg.errors import AbortReason, DropReason
from secagg.messages import ShareRelay
from secagg.server import ServerAborted, ServerMaskedInputCollection
from secagg.testing import StepHarness


def _setup(n: int = 5, **kw):
    h = StepHarness(num_clients=n, **kw)
    keylists = h.advance_to("share_keys")
    replies = {i: msgs[0] for i, msgs in h.deliver(keylists).items()}
    return h, replies


def test_relays_each_blob_to_its_receiver_unchanged() -> None:
    h, sk = _setup()
    for i, m in sk.items():
        h.server, _ = h.server.handle(i, m)
    out = h.close()
    assert isinstance(h.server, ServerMaskedInputCollection)
    for v, relay in out.items():
        assert isinstance(relay, ShareRelay)
        assert [u for u, _ in relay.shares] == [u for u in range(5) if u != v]
        for u, blob in relay.shares:
            assert blob == dict(sk[u].shares)[v]
    assert h.server.record.relayed[2] == frozenset({0, 1, 3, 4})


def _dropped(h, sk, sender, msg, reason=DropReason.MALFORMED_MESSAGE) -> dict:
    for i, m in sk.items():
        h.server, _ = h.server.handle(sender if i == sender else i, msg if i == sender else m)
    assert h.server.record.dropped[sender] == ("share_keys", reason)
    out = h.close()
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
def test_malformed_share_messages_drop_the_sender(mutate) -> None:
    h, sk = _setup()
    bad = dataclasses.replace(sk[1], shares=tuple(mutate(list(sk[1].shares))))
    out = _dropped(h, sk, 1, bad)
    assert len(out) == 4


def test_self_addressed_share_is_unknown_receiver() -> None:
    h, sk = _setup()
    shares = list(sk[1].shares)
    shares[0] = (1, shares[0][1])
    _dropped(h, sk, 1, dataclasses.replace(sk[1], shares=tuple(shares)))


def test_replay_from_another_round_drops_the_sender() -> None:
    h, sk = _setup()
    _dropped(h, sk, 3, dataclasses.replace(sk[3], round_idx=7), DropReason.WRONG_SESSION_OR_ROUND)


def test_a_device_that_did_not_advertise_is_ignored() -> None:
    h = StepHarness(num_clients=5)
    keylists = h.advance_to("share_keys", drop={"advertise_keys": [4]})
    other = StepHarness(num_clients=5)
    other_sk = {i: m[0] for i, m in other.deliver(other.advance_to("share_keys")).items()}
    h.server, _ = h.server.handle(4, other_sk[4])
    assert 4 not in h.server.record.dropped or h.server.record.dropped[4][0] != "share_keys"
    assert h.server.record.rejections[-1].device_id == 4
    assert 4 not in keylists


def test_too_few_shared_aborts() -> None:
    h, sk = _setup()
    for i in (0, 1):
        h.server, _ = h.server.handle(i, sk[i])
    h.server, out = h.server.close()
    assert isinstance(h.server, ServerAborted) and h.server.reason is AbortReason.TOO_FEW_SHARED
    assert {m.device_id for m in out} == set(range(5))
