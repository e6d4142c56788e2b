"""Limits on what a peer can make the coordinator do (pure; no I/O, no
asyncio; every clock is injected, seconds from any monotonic origin).

    bucket = TokenBucket(rate=2.0, burst=20, now=clock())
    wait = bucket.take(clock())            0.0: allowed; else seconds until it would be
    limiter = RateLimiter(rate, burst, clock)
    wait = limiter.take(peer_key)          one TokenBucket per key, memory bounded
    slots = StreamSlots(total=1024, per_key=256)
    refusal = slots.acquire(key)           None: a slot is held, release(key) later
    throttle = Throttle(interval_s, clock) throttle.allow(): at most once per interval
    budget = LogBudget(interval_s, clock)  budget.take(): None (stay quiet) or the count
                                           of lines suppressed since the last one
    key = peer_key(context.peer(), client_id)

The servicer (coordinator/servicer.py) applies them; the device registry
uses a Throttle for lookups of unknown device ids. What each limit is for
and its default: docs/decisions.md D24.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

Clock = Callable[[], float]

#: A RateLimiter remembers at most this many keys (least recently used
#: forgotten first; a forgotten key starts again from a full bucket).
MAX_TRACKED_KEYS = 65_536

# Sizes a peer may send, refused beyond (InvalidArgument / ProtocolViolation /
# InvalidDeviceAnswer where they are checked: registry.py, relay.py).
#: Devices in one EnrollRequest.
MAX_ENROLL_DEVICES = 10_000
#: Characters of a device's local id (its user handle).
MAX_LOCAL_ID_CHARS = 256
#: Devices one client session may announce.
MAX_ANNOUNCED_DEVICES = 100_000
#: Characters of a client's name kept (longer names are cut).
MAX_CLIENT_NAME_CHARS = 128
#: Seconds an operator's top-k request may wait for its device.
MAX_TIMEOUT_S = 300.0
#: Top-k requests in flight at once, over all sessions; more are refused (Unavailable).
MAX_PENDING = 10_000
#: Longest dataset item id or title a device may send back.
MAX_ITEM_TEXT = 512


@dataclass(slots=True)
class TokenBucket:
    """`burst` tokens at most, refilled at `rate` per second; each event
    takes one token."""

    rate: float
    burst: float
    tokens: float
    updated: float

    @classmethod
    def full(cls, rate: float, burst: float, now: float) -> TokenBucket:
        if rate <= 0 or burst < 1:
            raise ValueError(f"a token bucket needs rate > 0 and burst >= 1, got rate={rate}, burst={burst}")
        return cls(rate=rate, burst=float(burst), tokens=float(burst), updated=now)

    def refill(self, now: float) -> None:
        if now > self.updated:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = max(self.updated, now)

    def take(self, now: float) -> float:
        """0.0 when a token was taken; otherwise nothing is taken and the
        result is the seconds until one is available (> 0)."""
        self.refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate

    def is_full(self, now: float) -> bool:
        self.refill(now)
        return self.tokens >= self.burst


class RateLimiter:
    """A TokenBucket per key (a peer): `take(key)` -> 0.0 allowed, else the
    seconds to wait. At most `max_keys` buckets are kept; the least recently
    used one is forgotten first (a key seen again gets a full bucket, so an
    attacker spreading over more than `max_keys` addresses gains at most a
    fresh burst per address)."""

    def __init__(self, rate: float, burst: int, clock: Clock, *, max_keys: int = MAX_TRACKED_KEYS) -> None:
        TokenBucket.full(rate, burst, 0.0)  # validates
        if max_keys < 1:
            raise ValueError("max_keys must be >= 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._max_keys = max_keys
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def take(self, key: str) -> float:
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = TokenBucket.full(self.rate, self.burst, now)
            self._buckets[key] = bucket
            while len(self._buckets) > self._max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        return bucket.take(now)

    def __len__(self) -> int:
        return len(self._buckets)


class StreamSlots:
    """Concurrent streams: at most `total` in all and `per_key` per key.
    `acquire(key)` returns None when a slot is now held (the caller must
    `release(key)` exactly once), else why not."""

    def __init__(self, total: int, per_key: int) -> None:
        if total < 1 or per_key < 1:
            raise ValueError(f"stream limits must be >= 1, got total={total}, per_key={per_key}")
        self.total = total
        self.per_key = per_key
        self.open = 0
        self._by_key: dict[str, int] = {}

    def acquire(self, key: str) -> str | None:
        if self.open >= self.total:
            return f"the coordinator has {self.open} open streams (at most {self.total})"
        held = self._by_key.get(key, 0)
        if held >= self.per_key:
            return f"this peer has {held} open streams (at most {self.per_key})"
        self.open += 1
        self._by_key[key] = held + 1
        return None

    def release(self, key: str) -> None:
        held = self._by_key.get(key, 0)
        if held <= 0:
            raise ValueError(f"release of a stream slot that {key!r} does not hold")
        if held == 1:
            del self._by_key[key]
        else:
            self._by_key[key] = held - 1
        self.open -= 1

    def held(self, key: str) -> int:
        return self._by_key.get(key, 0)


class Throttle:
    """At most one allowed event per `interval_s` (the first is allowed)."""

    def __init__(self, interval_s: float, clock: Clock) -> None:
        if interval_s < 0:
            raise ValueError("interval_s must be >= 0")
        self.interval_s = interval_s
        self._clock = clock
        self._last: float | None = None

    def allow(self) -> bool:
        now = self._clock()
        if self._last is not None and now - self._last < self.interval_s:
            return False
        self._last = now
        return True


class LogBudget:
    """At most one log line per `interval_s` for a kind of event a peer can
    repeat at will (refused streams, refused enrolments): `take()` is None
    when this occurrence should not be logged, else the number of
    occurrences suppressed since the last logged one (to log with it)."""

    def __init__(self, interval_s: float, clock: Clock) -> None:
        self._throttle = Throttle(interval_s, clock)
        self._suppressed = 0

    def take(self) -> int | None:
        if not self._throttle.allow():
            self._suppressed += 1
            return None
        n, self._suppressed = self._suppressed, 0
        return n


def peer_key(peer: str, client_id: str | None = None) -> str:
    """The key per-peer limits count under: the verified client identity
    (mTLS certificate CN) when there is one, else the peer's host from
    gRPC's `context.peer()` ("ipv4:1.2.3.4:5678", "ipv6:[2001:db8::1]:5678",
    "unix:/path"); an IPv6 host counts as its /64 network (one site, which
    can use any of its 2^64 addresses). Unparseable peers key as themselves."""
    if client_id:
        return "id:" + client_id
    scheme, sep, rest = peer.partition(":")
    if not sep:
        return peer
    if scheme == "ipv4":
        return "ipv4:" + rest.rpartition(":")[0]
    if scheme == "ipv6":
        host = rest.rpartition(":")[0].strip("[]")
        host = host.split("%", 1)[0]  # zone index
        try:
            net = ipaddress.IPv6Network(f"{host}/64", strict=False)
        except ValueError:
            return peer
        return f"ipv6:{net}"
    return peer


def announced_refusal(count: int, limit: int) -> str | None:
    """Why a Hello / CheckIn announcing `count` devices is refused, or None."""
    if count > limit:
        return f"{count} devices announced in one message (at most {limit}: limits.max_announced_devices)"
    return None


__all__ = [
    "MAX_TRACKED_KEYS",
    "LogBudget",
    "RateLimiter",
    "StreamSlots",
    "Throttle",
    "TokenBucket",
    "announced_refusal",
    "peer_key",
]
