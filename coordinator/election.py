"""Leading a tier of active replicas (D109): a replica that serves devices
whatever its role takes the leader lease when it can, leads while it holds
it, and goes back to being a candidate when it loses it.

`LeaderElection` runs a loop over a `LeaseKeeper` (D90's leader lease):
- candidate: `keeper.acquire` polls the lease every `poll_s` until it is
  granted (another replica leads meanwhile; this one keeps serving); a
  store error is logged (`lease_poll_failed`) and the polling goes on;
- leader: the keeper renews on its own thread (`keep_in_background`,
  started before `on_lead`, so start-up costs never delay a renewal), and
  `on_lead(lease)` is awaited (the host recovers the rounds a previous
  leader left and starts its planner). When the keeper reports the lease
  lost, `on_depose(reason)` is awaited (the host stops its planner; the
  store's fence refuses a deposed leader's writes anyway) and the replica
  is a candidate again. It never exits on a loss: the process keeps
  serving its devices and running its groups.
- An exception from `on_lead` is logged; the lease is released and
  `on_depose` awaited with the reason, then the replica waits `poll_s` and
  is a candidate again.
- `stop()` ends the loop: a leader awaits `on_depose("stopped")` while it
  still holds the lease, then releases it (a candidate elsewhere takes over
  at once); a candidate stops polling. A grant that lands while a
  candidate is being stopped is not released: it expires after lease_s.
`leading` is the lease while this replica leads, else None; `terms` counts
the terms it led. Runs on the event loop; `on_lead` and `on_depose` run
there too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from coordinator.leadership import LeaseKeeper
from coordinator.logs import log_event
from coordinator.store import Lease, StoreError

#: The reason `on_depose` gets when `stop()` ends a term.
STOPPED = "stopped"


class LeaderElection:
    """See the module doc."""

    def __init__(self, keeper: LeaseKeeper, *, on_lead: Callable[[Lease], Awaitable[None]],
                 on_depose: Callable[[str], Awaitable[None]], poll_s: float | None = None) -> None:
        self.keeper = keeper
        self._on_lead, self._on_depose = on_lead, on_depose
        self.poll_s = poll_s if poll_s is not None else max(keeper.lease_s / 5.0, 0.2)
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.leading: Lease | None = None
        self.terms = 0

    def start(self) -> asyncio.Task[None]:
        """Run the loop as a task of the running event loop (once)."""
        if self._task is not None:
            raise RuntimeError("the election was started already")
        self._task = asyncio.create_task(self.run(), name="fedmask-election")
        return self._task

    async def run(self) -> None:
        """Candidate, leader, candidate... until `stop()`."""
        while not self._stop.is_set():
            lease = await self._candidate()
            if lease is None:
                return
            await self._lead(lease)

    async def _candidate(self) -> Lease | None:
        """Wait for the lease; None when stopped first. A store error is
        logged and the polling goes on after `poll_s`: whether this replica
        is still in the tier is its membership keeper's call, not the
        election's, and a candidate that gave up would never lead again."""
        while not self._stop.is_set():
            acquiring = asyncio.create_task(self.keeper.acquire(poll_s=self.poll_s))
            stopping = asyncio.create_task(self._stop.wait())
            await asyncio.wait({acquiring, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not acquiring.done():
                acquiring.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await acquiring
                return None
            try:
                return acquiring.result()
            except StoreError as exc:
                log_event("lease_poll_failed", logging.WARNING, replica=self.keeper.holder, error=str(exc)[:200])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.poll_s)
        return None

    async def _lead(self, lease: Lease) -> None:
        """One term: lead until the lease is lost or `stop()`."""
        loop = asyncio.get_running_loop()
        lost = asyncio.Event()
        reasons: list[str] = []

        def on_lost(reason: str) -> None:  # on the keeper's thread
            reasons.append(reason)
            loop.call_soon_threadsafe(lost.set)

        halt = self.keeper.keep_in_background(on_lost)
        self.leading = lease
        self.terms += 1
        try:
            await self._on_lead(lease)
        except Exception as exc:  # the host could not start leading: give the lease up, try again later
            log_event("leading_failed", logging.ERROR, replica=self.keeper.holder, error=f"{type(exc).__name__}: {exc}")
            await asyncio.to_thread(halt)
            await self._end_term(f"leading failed: {type(exc).__name__}: {exc}", release=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.poll_s)
            return
        waiting = {asyncio.create_task(lost.wait()), asyncio.create_task(self._stop.wait())}
        _, pending = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        await asyncio.to_thread(halt)
        if reasons:
            log_event("leadership_lost", logging.WARNING, replica=self.keeper.holder, reason=reasons[0])
            await self._end_term(reasons[0], release=False)
        else:
            await self._end_term(STOPPED, release=True)

    async def _end_term(self, reason: str, *, release: bool) -> None:
        """`on_depose(reason)` (its failure logged), then release the lease
        when it may still be held."""
        try:
            await self._on_depose(reason)
        except Exception as exc:
            log_event("depose_failed", logging.ERROR, replica=self.keeper.holder, error=f"{type(exc).__name__}: {exc}")
        finally:
            self.leading = None
            if release:
                await self.keeper.release()

    async def stop(self) -> None:
        """End the loop (see the module doc) and wait for it."""
        self._stop.set()
        if self._task is not None:
            await self._task


__all__ = ["STOPPED", "LeaderElection"]
