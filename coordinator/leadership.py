"""Leading the federation under a lease (D90): take the store's leader
lease, keep renewing it, and say at once when it is lost.

`LeaseKeeper` is the only caller of the store's lease methods: by default
the store's `acquire_lease` / `release_lease`, or the pair of callables it
is given with the same contract (`acquire_lease(holder, seconds)` -> the
granted or renewed `Lease`, None while another holder's runs;
`release_lease(lease)` ends that term if it is still current), so that any
lease row with those semantics is kept by the same rule (a replica's
membership term, coordinator/membership.py); `holder_of` and `labels` then
say who holds that lease and how the logs name it. Contract:
- `acquire(wait_s)` returns once this replica holds the lease. A replica
  whose lease is held by another waits (a standby), logging who leads;
  with `wait_s`, it gives up after that long (`LeaseHeld`): the answer of a
  store that serves one coordinator (SQLite), where a second live process
  is a mistake, and a restarted one waits out its predecessor's lease.
- `keep()` (on a thread of its own, `keep_in_background`) renews every
  third of the lease and returns with the reason when the lease is lost: another replica holds it, or no renewal reached
  the store before `lost_after` (the lease minus a safety margin, counted
  on this process's monotonic clock from the store's answer), whether the
  store answered with errors or did not answer at all (a renewal is waited
  for until `lost_after` only: a cut network cannot hang it). After that
  the replica must stop leading; the store's fence refuses its writes
  anyway (`fence()` keeps returning the last lease it held).
- `release()` ends the term on a clean shutdown so a standby takes over at
  once.

`lease_state` is the pure rule, apart from the I/O, so it is tested alone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Literal

from coordinator.logs import log_event
from coordinator.store import Lease, Store, StoreError

#: Fraction of the lease after which the holder stops counting on it
#: without a renewal: leaves 20% for clock-rate drift and a slow store.
SAFETY = 0.8

LeaseVerdict = Literal["renew", "wait", "lost"]


class LeaseHeld(Exception):
    """Another live process holds the lease (and kept it for `wait_s`)."""


@dataclass(frozen=True, slots=True)
class LeaseLabels:
    """How the keeper's logs and reasons name the lease it keeps: the lease
    itself (`lease`), the events of a grant and of waiting for another
    holder (`granted`, `waiting`, whose field `holder_field` names that
    holder), and the reason given when another holder took it (`taken`).
    The defaults are the leader lease's (D90)."""

    lease: str = "the store's leader lease"
    granted: str = "leader_elected"
    waiting: str = "standby"
    holder_field: str = "leader"
    taken: str = "another replica holds the lease"


LEADER_LABELS = LeaseLabels()


def default_replica_id() -> str:
    """HOSTNAME-PID: unique among live replicas."""
    return f"{socket.gethostname()}-{os.getpid()}"[:255]


@dataclass(frozen=True, slots=True)
class Term:
    """The lease as last granted, and when (this process's monotonic clock)."""

    lease: Lease
    granted_at: float

    @property
    def lost_after(self) -> float:
        return self.granted_at + SAFETY * self.lease.remaining_s

    @property
    def renew_after(self) -> float:
        return self.granted_at + self.lease.remaining_s / 3.0


def lease_state(term: Term, now: float) -> LeaseVerdict:
    """What the holder of `term` does at monotonic time `now`."""
    if now >= term.lost_after:
        return "lost"
    return "renew" if now >= term.renew_after else "wait"


class LeaseKeeper:
    """Holds the leader lease for one replica (see the module doc)."""

    def __init__(self, store: Store, holder: str, lease_s: float, *,
                 clock: Callable[[], float] = time.monotonic,
                 acquire_lease: Callable[[str, float], Lease | None] | None = None,
                 release_lease: Callable[[Lease], None] | None = None,
                 holder_of: Callable[[], str | None] | None = None,
                 labels: LeaseLabels = LEADER_LABELS) -> None:
        """`acquire_lease` / `release_lease`: the lease's calls (see the
        module doc), the store's own when not given. `holder_of` only names,
        for the logs, who holds the lease while this replica waits (None:
        nobody it can name); by default the store's `current_lease`."""
        self._store, self.holder, self.lease_s, self._clock = store, holder, lease_s, clock
        self._acquire_lease = acquire_lease if acquire_lease is not None else store.acquire_lease
        self._release_lease = release_lease if release_lease is not None else store.release_lease
        self._holder_of = holder_of if holder_of is not None else self._leader
        self.labels = labels
        self._term: Term | None = None

    def _leader(self) -> str | None:
        held = self._store.current_lease()
        return None if held is None else f"{held.holder} ({held.remaining_s:.1f} s left)"

    def fence(self) -> Lease:
        """The last lease this replica held (the fence of its writes)."""
        if self._term is None:
            raise RuntimeError("the lease was never acquired")
        return self._term.lease

    async def _try(self) -> Lease | None:
        asked_at = self._clock()
        lease = await asyncio.to_thread(self._acquire_lease, self.holder, self.lease_s)
        if lease is not None:
            self._term = Term(lease, asked_at)  # count from the question: never later than the store's clock
        return lease

    async def acquire(self, *, wait_s: float | None = None, poll_s: float | None = None) -> Lease:
        poll = poll_s if poll_s is not None else max(self.lease_s / 5.0, 0.2)
        deadline = None if wait_s is None else self._clock() + wait_s
        logged = -float("inf")
        while True:
            lease = await self._try()
            if lease is not None:
                log_event(self.labels.granted, replica=self.holder, token=lease.token, lease_s=self.lease_s)
                return lease
            who = await asyncio.to_thread(self._holder_of) or "another replica"
            if deadline is not None and self._clock() >= deadline:
                raise LeaseHeld(f"{self.labels.lease} is held by {who}")
            if self._clock() - logged >= 30.0:
                log_event(self.labels.waiting, replica=self.holder, **{self.labels.holder_field: who})
                logged = self._clock()
            await asyncio.sleep(poll)

    def keep(self, stop: threading.Event) -> str | None:
        """Renew until the lease is lost (returns why) or `stop` is set
        (returns None). Blocking: run it on a thread of its own
        (`keep_in_background`), so that nothing the event loop does (a
        model loading, a long round step) can delay a renewal."""
        while not stop.is_set():
            term = self._term
            if term is None:
                raise RuntimeError("keep() before acquire()")
            verdict = lease_state(term, self._clock())
            if verdict == "lost":
                return f"no renewal reached the store within {SAFETY * term.lease.remaining_s:.1f} s"
            if verdict == "wait":
                stop.wait(max(term.renew_after - self._clock(), 0.01))
                continue
            asked_at = self._clock()
            try:
                lease = self._renew_before(term.lost_after)
            except TimeoutError:  # the store did not answer in time (a silent network): the term is over
                return f"no renewal reached the store within {SAFETY * term.lease.remaining_s:.1f} s"
            except StoreError as exc:  # keep trying until lost_after
                log_event("lease_renewal_failed", logging.WARNING, replica=self.holder, error=str(exc)[:200])
                stop.wait(min(1.0, self.lease_s / 10.0))
                continue
            if lease is None:
                return self.labels.taken
            if lease.token != term.lease.token:  # it expired and this replica took a NEW term: step down
                self._release_lease(lease)
                return "the lease expired before it was renewed"
            self._term = Term(lease, asked_at)
        return None

    def _renew_before(self, deadline: float) -> Lease | None:
        """The lease's `acquire_lease`, waited for until `deadline` (this
        process's clock) and no longer: raises TimeoutError then. The call
        runs on a daemon thread of its own, so a store that never answers (a
        network that drops packets: no error, no reset, a read that waits on
        TCP timeouts) cannot hold the keeper past the end of its term. A
        renewal that lands after the keeper gave up is released at once,
        so that a standby does not wait out a term nobody leads."""
        answer: Future[Lease | None] = Future()

        def call() -> None:
            try:
                answer.set_result(self._acquire_lease(self.holder, self.lease_s))
            except BaseException as exc:  # handed to the keeper, which re-raises it
                answer.set_exception(exc)

        threading.Thread(target=call, name="fedmask-lease-renewal", daemon=True).start()
        try:
            return answer.result(timeout=max(deadline - self._clock(), 0.0))
        except TimeoutError:
            answer.add_done_callback(self._release_late)
            raise

    def _release_late(self, answer: Future[Lease | None]) -> None:
        lease = None if answer.exception() is not None else answer.result()
        if lease is not None:
            try:
                self._release_lease(lease)
            except StoreError as exc:
                log_event("lease_release_failed", logging.WARNING, replica=self.holder, error=str(exc)[:200])

    def keep_in_background(self, on_lost: Callable[[str], None]) -> Callable[[], None]:
        """Run `keep` on a daemon thread; `on_lost(reason)` is called from
        that thread when the lease is lost. Returns the function that stops
        the thread (and waits for it)."""
        stop = threading.Event()

        def run() -> None:
            reason = self.keep(stop)
            if reason is not None:
                on_lost(reason)

        thread = threading.Thread(target=run, name="fedmask-lease", daemon=True)
        thread.start()

        def halt() -> None:
            stop.set()
            thread.join(timeout=self.lease_s)

        return halt

    async def release(self) -> None:
        if self._term is not None:
            try:
                await asyncio.to_thread(self._release_lease, self._term.lease)
            except StoreError as exc:
                log_event("lease_release_failed", logging.WARNING, replica=self.holder, error=str(exc)[:200])
