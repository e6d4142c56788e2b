"""Bounded retries with jittered exponential backoff, for database
transactions that the server rolled back because of concurrency
(PostgreSQL serialization failures and deadlocks).

    result = run_with_retries(attempt, retryable=is_transient, policy=RetryPolicy())

Contract: `attempt` is called at most `policy.attempts` times; it is called
again only when the exception it raised satisfies `retryable`, and the
caller guarantees that such an exception means the attempt had NO effect
(its transaction was rolled back), so running it again is safe even when it
is not idempotent. Any other exception, or a retryable one on the last
attempt, propagates unchanged.

Pure logic: the sleep function and the random source are injected (tests
pass fakes).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many times to try and how long to wait in between.

    The wait before try k+1 (k = 1, 2, ...) is uniform in
    [0, min(max_delay, base_delay * 2**(k-1))] ("full jitter"), so callers
    that collided once spread out instead of colliding again in lock-step.
    """

    attempts: int = 8
    base_delay: float = 0.005
    max_delay: float = 0.25

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError(f"delays must be >= 0, got base {self.base_delay}, max {self.max_delay}")

    def delay(self, failed_attempts: int, rng: random.Random) -> float:
        """Seconds to wait after `failed_attempts` (>= 1) failures."""
        if failed_attempts < 1:
            raise ValueError(f"failed_attempts must be >= 1, got {failed_attempts}")
        cap = min(self.max_delay, self.base_delay * 2 ** (failed_attempts - 1))
        return rng.uniform(0.0, cap)


def run_with_retries(
    attempt: Callable[[], T],
    *,
    retryable: Callable[[BaseException], bool],
    policy: RetryPolicy = RetryPolicy(),
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
    on_retry: Callable[[int, BaseException], None] | None = None,
) -> T:
    """`attempt()`'s result, retrying it while it raises a `retryable`
    exception, at most `policy.attempts` calls in all (see module docstring).
    `on_retry(failed_attempts, exc)` is called before each wait (logging)."""
    source = rng if rng is not None else random.Random()
    failures = 0
    while True:
        try:
            return attempt()
        except Exception as exc:
            failures += 1
            if failures >= policy.attempts or not retryable(exc):
                raise
            if on_retry is not None:
                on_retry(failures, exc)
            sleep(policy.delay(failures, source))
