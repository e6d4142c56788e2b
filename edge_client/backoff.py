"""Reconnect delays: exponential backoff with full jitter.

Attempt a (0-based, counting consecutive failures) waits

    delay_a = U(0, min(cap, base * multiplier**a))

("full jitter", Brooker, AWS Architecture Blog 2015): a fleet of clients that
lost the coordinator at the same instant spreads its reconnects over the whole
window instead of arriving in waves. The attempt counter resets once a session
was established (`reset()`). Randomness and sleeping are injected (`uniform`
draws from [0, 1), `sleep` takes seconds), so schedules are testable without
waiting.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from wire.protocol import RETRY_PUSHBACK_KEY


@dataclass
class Backoff:
    base: float = 0.5
    cap: float = 30.0
    multiplier: float = 2.0
    uniform: Callable[[], float] = field(default_factory=lambda: random.SystemRandom().random)
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    attempt: int = 0

    def __post_init__(self) -> None:
        if not (self.base > 0 and self.cap >= self.base and self.multiplier >= 1):
            raise ValueError("backoff needs base > 0, cap >= base and multiplier >= 1")

    def ceiling(self, attempt: int) -> float:
        """The upper end of the jitter window of `attempt` (without randomness)."""
        # min() before the power would overflow for large attempts
        if attempt > 64:
            return self.cap
        return min(self.cap, self.base * self.multiplier**attempt)

    def next_delay(self) -> float:
        """The delay before the next reconnect; advances the attempt counter."""
        d = self.uniform() * self.ceiling(self.attempt)
        self.attempt += 1
        return d

    async def wait(self) -> float:
        """Sleep for `next_delay()`; returns the seconds slept."""
        d = self.next_delay()
        await self.sleep(d)
        return d

    def reset(self) -> None:
        self.attempt = 0


#: The longest wait a coordinator's retry-pushback hint can impose.
MAX_PUSHBACK_S = 60.0


def retry_pushback_s(trailing_metadata: Iterable[tuple[str, str | bytes]] | None) -> float | None:
    """Seconds the coordinator asked a refused client to wait (its
    `grpc-retry-pushback-ms` trailer), capped at MAX_PUSHBACK_S; None
    without a valid hint (then the client's own backoff applies)."""
    for key, value in trailing_metadata or ():
        if key.lower() != RETRY_PUSHBACK_KEY:
            continue
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        if text.isdigit():
            return min(int(text) / 1000.0, MAX_PUSHBACK_S)
    return None
