"""The pure limits (coordinator/limits.py) with a fake clock, and the
sanitising of log values and status details (coordinator/logs.py)."""

from __future__ import annotations

import logging

import pytest

from coordinator.limits import (
    LogBudget,
    RateLimiter,
    StreamSlots,
    Throttle,
    TokenBucket,
    announced_refusal,
    peer_key,
)
from coordinator.logs import MAX_LOG_VALUE_CHARS, format_event, log_event, sanitize


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_token_bucket_allows_a_burst_then_the_rate() -> None:
    b = TokenBucket.full(rate=2.0, burst=3, now=0.0)
    assert [b.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert b.take(0.0) == pytest.approx(0.5)  # one token in 1/rate s
    assert b.take(0.25) == pytest.approx(0.25)  # refused takes nothing
    assert b.take(0.5) == 0.0
    assert b.take(0.5) == pytest.approx(0.5)
    assert b.take(100.0) == 0.0 and b.tokens == pytest.approx(2.0)  # refilled to the burst, not beyond
    assert b.take(50.0) == 0.0  # a clock going back neither refills nor breaks it
    with pytest.raises(ValueError):
        TokenBucket.full(rate=0.0, burst=1, now=0.0)
    with pytest.raises(ValueError):
        TokenBucket.full(rate=1.0, burst=0, now=0.0)


def test_rate_limiter_keeps_a_bucket_per_key_and_bounds_memory() -> None:
    clock = FakeClock()
    lim = RateLimiter(rate=1.0, burst=2, clock=clock, max_keys=3)
    assert [lim.take("a") for _ in range(2)] == [0.0, 0.0]
    assert lim.take("a") == pytest.approx(1.0)
    assert lim.take("b") == 0.0  # another peer is not affected
    clock.t += 0.5
    assert lim.take("a") == pytest.approx(0.5)
    for k in ("c", "d", "e"):
        lim.take(k)
    assert len(lim) == 3  # least recently used forgotten
    clock.t += 10
    assert lim.take("a") == 0.0


def test_stream_slots_cap_all_and_per_key() -> None:
    slots = StreamSlots(total=3, per_key=2)
    assert slots.acquire("a") is None and slots.acquire("a") is None
    assert "this peer has 2 open streams (at most 2)" == slots.acquire("a")
    assert slots.acquire("b") is None
    refusal = slots.acquire("c")
    assert refusal is not None and "3 open streams (at most 3)" in refusal
    slots.release("a")
    assert slots.acquire("c") is None and slots.open == 3 and slots.held("a") == 1
    for k in ("a", "b", "c"):
        slots.release(k)
    assert slots.open == 0 and slots.held("a") == 0
    with pytest.raises(ValueError, match="does not hold"):
        slots.release("a")


def test_throttle_and_log_budget() -> None:
    clock = FakeClock()
    t = Throttle(1.0, clock)
    assert t.allow() and not t.allow()
    clock.t += 0.99
    assert not t.allow()
    clock.t += 0.02
    assert t.allow()
    assert Throttle(0.0, clock).allow() and Throttle(0.0, clock).allow()
    budget = LogBudget(1.0, clock)
    assert budget.take() == 0
    assert [budget.take() for _ in range(5)] == [None] * 5
    clock.t += 1.0
    assert budget.take() == 5 and budget.take() is None


@pytest.mark.parametrize(
    ("peer", "client_id", "key"),
    [
        ("ipv4:10.0.0.7:51234", None, "ipv4:10.0.0.7"),
        ("ipv4:10.0.0.7:1", None, "ipv4:10.0.0.7"),  # another port, same host
        ("ipv6:[2001:db8:1:2:aaaa::1]:5000", None, "ipv6:2001:db8:1:2::/64"),
        ("ipv6:[2001:db8:1:2:bbbb::9]:6000", None, "ipv6:2001:db8:1:2::/64"),  # same /64
        ("ipv6:[::1]:5000", None, "ipv6:::/64"),
        ("ipv4:10.0.0.7:51234", "device-0001", "id:device-0001"),  # mTLS: the certificate's name
        ("unix:/tmp/s", None, "unix:/tmp/s"),
        ("ipv6:[not-an-address]:1", None, "ipv6:[not-an-address]:1"),
        ("weird", None, "weird"),
    ],
)
def test_peer_key(peer: str, client_id: str | None, key: str) -> None:
    assert peer_key(peer, client_id) == key


def test_announced_refusal() -> None:
    assert announced_refusal(10, 10) is None
    assert "11 devices announced in one message (at most 10" in (announced_refusal(11, 10) or "")


# --------------------------------------------------------------------------- logs


def test_format_event_caps_values_and_cannot_forge_a_line() -> None:
    line = format_event("session_refused", {"why": "x" * 4_000_000, "peer": "ipv4:1.2.3.4:5"})
    assert len(line) < 2 * MAX_LOG_VALUE_CHARS + 100
    assert "3999744 more chars" in line and "peer=ipv4:1.2.3.4:5" in line
    forged = format_event("e", {"name": "a\nevent=admin_login user=root", "cr": "ok\rEVIL", "esc": "\x1b[2J",
                                "sep": "a\u2028b", "plain": "fine"})
    assert "\n" not in forged and "\r" not in forged and "\x1b" not in forged and "\u2028" not in forged
    assert "name='a\\nevent=admin_login user=root'" in forged
    assert "cr='ok\\rEVIL'" in forged and "esc='\\x1b[2J'" in forged and "sep='a\\u2028b'" in forged
    assert forged.endswith("plain=fine")


def test_log_event_of_a_huge_value_is_bounded(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="fedmask.coordinator"):
        log_event("hello", client="c" * (4 << 20), version="v\n" * 1000)
    (record,) = caplog.records
    assert len(record.getMessage()) < 1000 and "\n" not in record.getMessage()


def test_sanitize_clips_and_escapes_details() -> None:
    assert sanitize("fine detail") == "fine detail"
    out = sanitize("a\nb\x00c" + "z" * 10_000, limit=20)
    assert out.startswith("a\\nb\\x00c") and "more chars" in out and len(out) < 60 and out.isprintable()
