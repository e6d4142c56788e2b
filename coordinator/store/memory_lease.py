"""The leader lease in the in-memory store (D90). A mixin of `InMemoryStore`;
the contracts are those of coordinator/store/interface.py. The "database
clock" of a store in process memory is the process's monotonic clock (a
parameter, so tests can move it)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from coordinator.store.lease_records import FencedOut, Lease, LeaseRow, check_lease_request, next_lease_row


class InMemoryLeaderLease:
    """One lease row in process memory."""

    def __init__(self, lease_clock: Callable[[], float] = time.monotonic) -> None:
        self._lease_lock = threading.RLock()
        self._lease_clock = lease_clock
        self._lease_holder: str | None = None
        self._lease_token = 0
        self._lease_expires = -float("inf")
        self._default_fence: Callable[[], Lease] | None = None

    def fence_writes(self, fence: Callable[[], Lease]) -> None:
        self._default_fence = fence

    def acquire_lease(self, holder: str, seconds: float) -> Lease | None:
        check_lease_request(holder, seconds)
        with self._lease_lock:
            row = LeaseRow(self._lease_holder, self._lease_token, self._lease_expires)
            after = next_lease_row(row, holder, seconds, self._lease_clock())
            if after is None:
                return None
            self._lease_holder, self._lease_token, self._lease_expires = holder, after.token, after.expires_at
            return Lease(holder, after.token, seconds)

    def release_lease(self, lease: Lease) -> None:
        with self._lease_lock:
            if self._lease_holder == lease.holder and self._lease_token == lease.token:
                self._lease_holder = None
                self._lease_expires = -float("inf")

    def current_lease(self) -> Lease | None:
        with self._lease_lock:
            remaining = self._lease_expires - self._lease_clock()
            if self._lease_holder is None or remaining <= 0:
                return None
            return Lease(self._lease_holder, self._lease_token, remaining)

    def _check_fence(self, fence: Lease | None) -> None:
        """Raise FencedOut unless `fence` (when given) is the current term.
        Callers hold `_lease_lock` around the check and their write."""
        if fence is None and self._default_fence is not None:
            fence = self._default_fence()
        if fence is not None and (fence.holder != self._lease_holder or fence.token != self._lease_token):
            raise FencedOut(f"{fence.holder} no longer leads (its token {fence.token}, now {self._lease_token})")
