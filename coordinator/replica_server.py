"""One replica of an active tier (D109), composed from its parts: a member
that holds device streams and runs the groups of its devices, and that
plans rounds across the tier while it holds the leader lease.

`ActiveReplica(settings, store, coordinator)` builds, over the host's
started `Coordinator` (its registry, delivery, model, ledger, reports,
spent devices and deadlines):
- `membership`: the `MembershipKeeper` of this replica's row, with the
  round settings' digest (`settings_digest`) and `replica.advertise_admin`;
- `publisher`: the `StreamPublisher` over the coordinator's registry,
  every `replica.publish_interval_s`, fenced by the membership term;
- `runner`: the `GroupRunner` of the groups the leader assigns here,
  polling every `replica.poll_s`; its local round is the coordinator's
  `round`, so the coordinator routes the devices' stage messages to it;
- `election`: a `LeaderElection` over the leader lease (D90, the same
  replica name) whose `on_lead` starts a `RoundPlanner` task (a fresh
  planner per term, fenced by that term) and whose `on_depose` stops it.

Contract:
- `start()` joins the tier first: while a term of this replica's name that
  this process did not start runs (a crashed predecessor), it waits at
  most `join_wait_s` (default 1.5 leases) and then raises `LeaseHeld`: the
  host refuses to serve. Then the membership is renewed on its own thread
  and the publisher, the runner and the election start.
- Losing the membership (the keeper reports it, or a publish finds the
  term fenced out) calls `on_membership_lost(reason)` once, on the event
  loop; the host turns it into NOT_SERVING and exit code 3, as D90 does for
  a deposed leader, and calls `stop()`. Nothing here stops on its own: the
  store refuses the old term's writes anyway.
- `stop()` stops everything in reverse order (the election, which stops a
  running planner and releases the leader lease; the runner; the
  publisher; the membership keeper) and leaves the tier, so the store
  drops this replica's streams at once.
Recovering the rounds a dead leader left before planning is the host's:
pass `recover` (awaited in `on_lead`, before the planner starts), and
`on_depose` (called first when a term ends). `fedmask coordinator
--replica-mode active` runs it (coordinator/active_serve.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import time
from collections.abc import Awaitable, Callable

from coordinator.election import LeaderElection
from coordinator.fleet_view import FleetView
from coordinator.grouped_rounds import GroupedRoundMachine
from coordinator.group_runner import GroupRunner
from coordinator.leadership import LeaseKeeper, default_replica_id
from coordinator.logs import log_event
from coordinator.membership import MembershipKeeper, settings_digest
from coordinator.model_cache import ModelCache
from coordinator.round_planner import RoundPlanner
from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from coordinator.store import FencedOut, Lease, Store
from coordinator.stream_publisher import DEFAULT_MAX_BACKOFF_S, StreamPublisher


class ActiveReplica:
    """See the module doc."""

    def __init__(self, settings: CoordinatorSettings, store: Store, coordinator: Coordinator, *,
                 on_membership_lost: Callable[[str], None], replica: str | None = None,
                 device_address: str | None = None, recover: Callable[[Lease], Awaitable[None]] | None = None,
                 on_depose: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None,
                 token: Callable[[int], bytes] = secrets.token_bytes) -> None:
        """`replica`: this replica's name (default `replica.id`, else
        HOSTNAME-PID); `device_address`: the HOST:PORT devices reach it at,
        written in its membership row; `clock`: the keepers' monotonic
        clock; `rng`, `token`: the planner's (cohort selection, nonces)."""
        self.settings, self.store, self.coordinator = settings, store, coordinator
        self.name = replica or settings.replica.id or default_replica_id()
        r = settings.replica
        self.digest = settings_digest(settings)
        self._on_membership_lost, self._recover, self._on_depose = on_membership_lost, recover, on_depose
        self._rng = rng if rng is not None else random.Random(settings.seed)
        self._token = token
        self.membership = MembershipKeeper(store, self.name, r.lease_s, settings_digest=self.digest,
                                           device_address=device_address, admin_address=r.advertise_admin,
                                           clock=clock)
        self.publisher = StreamPublisher(store, coordinator.registry, self.membership.member, on_lost=self._lost,
                                         publish_interval_s=r.publish_interval_s,
                                         max_backoff_s=max(DEFAULT_MAX_BACKOFF_S, r.publish_interval_s))
        # the coordinator routes its devices' stage messages to its `round`: the runner's local round
        self.runner = GroupRunner(store, self.membership.member, coordinator.delivery, coordinator.registry,
                                  ModelCache(store), poll_s=r.poll_s, wake=coordinator._round_event,
                                  on_round=self._host_round)
        self.leader = LeaseKeeper(store, self.name, r.lease_s, clock=clock)
        self.election = LeaderElection(self.leader, on_lead=self._lead, on_depose=self._depose)
        self.planner: RoundPlanner | None = None
        self._planning: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._halt_membership: Callable[[], None] | None = None
        self.lost: str | None = None  # why the membership was lost, once it was

    def leader_fence(self) -> Lease:
        """The fence of this replica's leader-only writes (for
        `store.fence_writes`): the leader lease it holds or last held;
        FencedOut when it never led, so a member's stray leader-only write
        is refused like a deposed leader's."""
        try:
            return self.leader.fence()
        except RuntimeError:
            raise FencedOut(f"replica {self.name!r} has not led the tier") from None

    def _host_round(self, machine: GroupedRoundMachine | None) -> None:
        self.coordinator.round = machine

    # ------------------------------------------------------------------ membership

    async def start(self, *, join_wait_s: float | None = None) -> None:
        """Join the tier (LeaseHeld after `join_wait_s`, default 1.5
        leases), then start keeping it, publishing, running groups and
        standing for leader."""
        wait = join_wait_s if join_wait_s is not None else 1.5 * self.membership.lease_s
        await self.membership.join(wait_s=wait, poll_s=self.settings.replica.poll_s)
        loop = asyncio.get_running_loop()

        def on_lost(reason: str) -> None:  # on the keeper's thread
            loop.call_soon_threadsafe(self._lost, reason)

        self._halt_membership = self.membership.keep_in_background(on_lost)
        self._tasks = [asyncio.create_task(self.publisher.run(), name="fedmask-stream-publisher"),
                       asyncio.create_task(self.runner.run(), name="fedmask-group-runner")]
        self.election.start()
        log_event("replica_active", replica=self.name, term=self.membership.member().token)

    def _lost(self, reason: str) -> None:
        """On the event loop: report the first loss of the membership."""
        if self.lost is not None:
            return
        self.lost = reason
        log_event("membership_lost", logging.ERROR, replica=self.name, reason=reason)
        self._on_membership_lost(reason)

    # ------------------------------------------------------------------ leading

    async def _lead(self, lease: Lease) -> None:
        """`on_lead`: recover (the host's), then plan rounds under `lease`'s term."""
        if self._recover is not None:
            await self._recover(lease)
        c = self.coordinator
        self.planner = RoundPlanner(self.settings, self.store, c.model, c.current, c.ledger, c.peer_reports, c.spent,
                                    FleetView(self.store, digest=self.digest), c.deadlines, self.leader.fence,
                                    rng=self._rng, token=self._token, poll_s=self.settings.replica.poll_s,
                                    skip=c.skip, held=lambda: c.holding)
        self._planning = asyncio.create_task(self._plan(self.planner, lease), name="fedmask-round-planner")

    async def _plan(self, planner: RoundPlanner, lease: Lease) -> None:
        try:
            await planner.run(self.settings.rounds)
        except Exception as exc:  # FencedOut once the term is over: the election hears of the loss itself
            log_event("round_planner_ended", logging.WARNING, replica=self.name, token=lease.token,
                      error=f"{type(exc).__name__}: {exc}")

    async def _depose(self, reason: str) -> None:
        """`on_depose`: stop the planner; a round it was running is left to
        the next leader's recovery (the store's fence refuses its writes)."""
        del reason  # logged by the election
        if self._on_depose is not None:
            self._on_depose()
        planner, task = self.planner, self._planning
        self.planner, self._planning = None, None
        if planner is not None:
            planner.stop()
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ------------------------------------------------------------------ shutdown

    async def stop(self) -> None:
        """Stop everything in reverse order and leave the tier."""
        await self.election.stop()
        self.runner.stop()
        self.publisher.stop()
        for task in reversed(self._tasks):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 5.0)
        self._tasks = []
        if self._halt_membership is not None:
            await asyncio.to_thread(self._halt_membership)
            self._halt_membership = None
        await self.membership.leave()


__all__ = ["ActiveReplica"]
