"""The leader's side of a round whose groups replicas run (D109): select a
cohort over the tier, plan it, write the plan, watch the group rows, add
the done groups' sums and commit, or abort, every write to the round's
outcome fenced by the leader lease (D90).

`RoundPlanner.run_round()` runs one round:

1. select: `FleetView.read()` (the live members with the leader's
   settings digest, their available devices and streams), the exclusions
   of the in-process `eligible()` (busy, spent, quarantined, previous
   contributors: `Fleet.eligible_by_replica`), then
   `round_groups.replica_groups` (a group inside one replica, a stream's
   devices in one group; `select_cohort` inside it). A round needs at
   least max(cohort.minimum, 2) eligible devices over the replicas kept;
   fewer: no round (None), nothing written, except that with `skip` (the
   host's `VersionSkip`, D94) a version spent by the rounds a dead leader
   left is skipped once its grace is over, as the in-process loop does.
2. plan: exactly the calls of the in-process `_run_round` (round_loop.py):
   `round_plan` for the cohort, `plan_groups` over the chosen groups, the
   epsilon budget priced at the worst group (over budget: no round,
   `budget_exceeded` logged), `TaskFields.for_round`, `build_round`; then
   each group's row (`assignment.assignment_for`) naming the replica's
   membership term, and the plan (`RoundPlan`: the model version and
   step, the task's hyper-parameters, the metric names, the cohort and
   its minimum, the rotation key, the stage and task deadlines, `closes_at`
   = opening + the stage and training deadlines + `close_margin_s`, the
   devices left out and why).
3. open: `open_planned_round` with the round's record, fenced.
4. watch: `round_groups` every `poll_s`; each change of the round's phase
   (the furthest stage of an open group) saved (`save_round_progress`).
   The open groups of a replica whose membership term is over (it died,
   or was cut off from the store for longer than its lease) are closed at
   once (`close_groups` for that replica, fenced: lost, `lost_in` their
   state, so one lost in `unmasking` is charged as released, D94).
   Until every group is final or `closes_at` passed.
5. finish: `close_groups` (fenced: open groups become lost, `lost_in`
   their state), the rows read with their sums, the done groups' sums added
   (`RemoteRound.combine`: `combine_group_sums` with `cohort_config`). When
   they count at least the plan's minimum and the model did not move since
   the plan: the model step (`CurrentModel.stepped`), the round's metrics
   (`round_report.round_metrics`, plus `devices_left_out` and
   `replica_groups.<replica>`), the ledger entry (`PrivacyLedger.entry_for`:
   every group the server may know priced, `remote_round`), `commit_round`
   (fenced), and the new version adopted. Otherwise `abort_round` (fenced)
   with `interrupted_charge.abort_charge` priced over the same groups; the
   record lists every device any group may have asked under
   `survivors["unmasking"]` (the store's `abort_round` does not merge them).
   Either way the stage deadlines first learn from the groups' completion
   times (`deadlines.observe`, as the in-process loop does; the replicas
   measure them, so the pickup lag of the rows is not in them).
6. the groups' share reports go to `ReportLedger.record` (the leader is
   the one writer of quarantines, D37).

A `FencedOut` (the lease moved: this process no longer leads) propagates
out of `run_round`, nothing more is written, the model is not adopted; the
caller steps down. `run()` loops rounds until `stop()`, a FencedOut, or
`rounds` rounds; while `held()` (the host's: an operator's pause, an
exhausted budget, a rollback) it opens none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from coordinator.assignment import assignment_for
from coordinator.current_model import CurrentModel
from coordinator.fleet_view import Fleet, FleetView
from coordinator.grouped_rounds import AnyRound, GroupedRoundMachine
from coordinator.interrupted_charge import abort_charge
from coordinator.logs import log_event
from coordinator.model_host import ServerModel
from coordinator.remote_round import RemoteRound
from coordinator.report_ledger import ReportLedger
from coordinator.round_groups import ReplicaPlan, replica_groups
from coordinator.round_machines import build_round, plan_groups
from coordinator.round_policy import AdaptiveDeadlines, round_plan
from coordinator.round_report import PrivacyLedger, round_metrics, round_record
from coordinator.round_tasks import TaskFields
from coordinator.settings import CoordinatorSettings
from coordinator.spent_devices import SpentDevices
from coordinator.version_skip import VersionSkip
from coordinator.store import (
    FencedOut,
    GroupAssignment,
    GroupRow,
    Lease,
    PrivacyEntry,
    RoundPlan,
    RoundRecord,
    RoundState,
    Store,
    utc_now,
)
from coordinator.store.group_records import new_group_row
from fedmask_proto.v1 import common_pb2
from secagg.errors import SecAggConfigError
from secagg.groups import partition_seed
from wire.secagg_codec import reason_name

P = common_pb2


@dataclass(frozen=True)
class Selection:
    """A round's cohort over the tier: the fleet as read, the groups chosen."""

    fleet: Fleet
    groups: ReplicaPlan
    nonce: bytes


class RoundPlanner:
    """See the module doc. `lease()`: the leader lease this process holds
    (e.g. `LeaderLease`'s current one); `token(n)`: n fresh random bytes."""

    def __init__(self, settings: CoordinatorSettings, store: Store, model: ServerModel, current: CurrentModel,
                 ledger: PrivacyLedger, peer_reports: ReportLedger, spent: SpentDevices, fleet: FleetView,
                 deadlines: AdaptiveDeadlines, lease: Callable[[], Lease], *, rng: random.Random,
                 token: Callable[[int], bytes], wall_clock: Callable[[], datetime] = utc_now,
                 poll_s: float = 0.2, close_margin_s: float = 30.0, skip: VersionSkip | None = None,
                 held: Callable[[], bool] | None = None) -> None:
        if settings.debug.insecure_plaintext or settings.hybrid.enabled:
            raise ValueError("replicas run rounds in groups: neither the plaintext nor the hybrid path runs there")
        self.settings, self.store, self.model, self.current = settings, store, model, current
        self.ledger, self.peer_reports, self.spent, self.fleet = ledger, peer_reports, spent, fleet
        self.deadlines = deadlines
        self.skip = skip  # D94: moves past a version that a dead leader's rounds spent
        self.held = held  # True while no round may open (the host's pause, budget, rollback)
        self._lease = lease
        self._rng = rng
        self._token = token
        self._wall = wall_clock
        self.poll_s = poll_s
        self.close_margin_s = close_margin_s
        self.round: RemoteRound | None = None  # the running round (None between rounds)
        self.previous_contributors: frozenset[int] = frozenset()
        self._last_number = 0
        self.rounds_run = 0
        self._stop = asyncio.Event()

    # ------------------------------------------------------------------ the loop

    def stop(self) -> None:
        self._stop.set()

    async def run(self, rounds: int | None = None) -> None:
        """Run rounds until `stop()`, `rounds` of them, or a FencedOut (raised)."""
        while not self._stop.is_set() and (rounds is None or self.rounds_run < rounds):
            try:
                r = None if self.held is not None and self.held() else await self.run_round()
            except FencedOut:
                raise
            except Exception as exc:  # a store outage, a bug: log it, back off, go on
                log_event("round_planner_error", logging.ERROR, error=f"{type(exc).__name__}: {exc}")
                logging.getLogger("fedmask.coordinator").debug("round planner error", exc_info=True)
                r = None
            if r is not None:
                self.rounds_run += 1
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.poll_s)

    async def run_round(self) -> RemoteRound | None:
        """One round, steps 1-6 of the module doc: the round as it ended,
        or None when none opened (too few devices, nothing fits, the budget)."""
        chosen = await self.select()
        if chosen is None:
            return None
        r = await self.open_round(chosen)
        if r is None:
            return None
        self.round = r
        try:
            await self.watch(r)
            await self.finish(r)
        except FencedOut:
            raise
        except Exception:  # a store outage, a bug: try to leave the round aborted (and charged), then raise
            if not r.phase.is_terminal:
                with contextlib.suppress(Exception):
                    await self._close_and_read(r, self._lease())
                    await self._abort(r, P.ABORT_REASON_CANCELLED, "internal coordinator error", self._lease())
            raise
        finally:
            self.round = None
            self._last_number = max(self._last_number, r.number)
            reports = r.share_reports()
            if reports:
                await self.peer_reports.record(r.number, reports, survivors=r.share_check_survivors())
        return r

    # ------------------------------------------------------------------ 1. select

    async def select(self) -> Selection | None:
        """The cohort and its groups over the tier (step 1), or None."""
        c = self.settings.cohort
        minimum = max(c.minimum, 2)
        target = max(c.selected, minimum)
        await self.peer_reports.refresh(self._last_number + 1)
        await self.spent.refresh(self.current.version)
        fleet = await asyncio.to_thread(self.fleet.read)
        busy = self.round.cohort if self.round is not None else ()
        eligible = fleet.eligible_by_replica(busy=busy, spent=self.spent.devices,
                                             previous_contributors=self.previous_contributors,
                                             allow_consecutive=c.allow_consecutive,
                                             excluded=self.peer_reports.excluded, minimum=minimum)
        count = sum(map(len, eligible.values()))
        if count < minimum:
            if self.skip is not None:  # spent by a round a dead leader left? then a skip version, once its grace is over
                available = [d for devices in fleet.available.values() for d in devices]
                await self.skip.step(self.spent, available, eligible=count, minimum=minimum)
            return None
        nonce = self._token(16)
        plan = replica_groups(eligible, fleet.hosts, group_size=self.settings.secagg.group_size, target=target,
                              minimum=minimum, seed=partition_seed(nonce, 0), rng=self._rng)
        if not plan.groups:
            return None
        return Selection(fleet, plan, nonce)

    # ------------------------------------------------------------------ 2-3. plan and open

    async def open_round(self, chosen: Selection) -> RemoteRound | None:
        """Plan the chosen round and write it, fenced (steps 2-3); None when
        nothing fits the cohort or the budget refuses it."""
        settings, model, current = self.settings, self.model, self.current
        cohort = list(chosen.groups.cohort)
        nonce = chosen.nonce
        try:
            config, metrics, mechanism = round_plan(settings, len(cohort), model.update_dim, nonce,
                                                    model.metric_names, plaintext=False)
            members = [m for _, m in chosen.groups.groups]
            plans = plan_groups(settings, config, members, mechanism)
        except (SecAggConfigError, ValueError) as exc:
            log_event("round_not_planned", logging.WARNING, cohort=len(cohort), why=str(exc))
            return None
        if self.ledger.budget is not None:
            worst = max([await asyncio.to_thread(self.ledger.epsilon_after, cohort=len(p.members),
                                                 counted=p.config.threshold, mechanism=p.mechanism) for p in plans])
            if worst > self.ledger.budget:
                log_event("budget_exceeded", logging.WARNING, next=f"{worst:.4g}", budget=self.ledger.budget)
                return None
        lease = self._lease()
        number = await asyncio.to_thread(self.store.next_round_number)
        version = current.version or 0
        fields = TaskFields.for_round(settings, model, current, version, len(cohort), metrics, mechanism)
        windows = self.deadlines.windows(active=config.active_adversary, cohort=len(cohort))
        machine, per_group = await asyncio.to_thread(lambda: build_round(
            settings, number=number, nonce=nonce, plans=plans, minimum=config.threshold, deadlines=windows.machine,
            identity=None, metrics=metrics, fields=fields, in_groups=True))
        now = self._wall()
        span = sum(windows.machine.values()) + sum(windows.task.values()) + self.close_margin_s
        left = chosen.groups
        plan = RoundPlan(round_number=number, lease_token=lease.token, nonce=nonce, model_name=model.name,
                         model_version=version, step=current.step, hyperparameters=dict(fields.hyperparameters),
                         metric_names=metrics.names, cohort_size=len(cohort), minimum=config.threshold,
                         rotation_key=nonce, deadlines=windows.machine, task_deadlines=windows.task, opened_at=now,
                         closes_at=now + timedelta(seconds=span), devices_left_out=left.devices_left_out,
                         left_out={"replicas": list(left.left_out_replicas)})
        rows = _rows(plan, machine, per_group, [chosen.fleet.members[name] for name, _ in left.groups])
        r = RemoteRound.of(plan, [_assigned(a) for a in rows])
        record = self._record(r, RoundState.ADVERTISE_KEYS)
        await asyncio.to_thread(self.store.open_planned_round, record, plan, rows, fence=lease)
        log_event("round_planned", round=number, cohort=len(cohort), groups=len(rows),
                  replicas=",".join(f"{k}={v}" for k, v in r.groups_by_replica().items()),
                  devices_left_out=left.devices_left_out, version=version)
        return r

    # ------------------------------------------------------------------ 4. watch

    async def watch(self, r: RemoteRound) -> None:
        """Poll the group rows until every group is final or the plan closes
        (step 4); each change of the round's phase saved."""
        saved = r.phase
        while not r.all_final and self._wall() < r.plan.closes_at and not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.poll_s)
            rows = await asyncio.to_thread(self.store.round_groups, r.number)
            gone = await asyncio.to_thread(self._departed, rows)
            if gone:  # a replica died or was cut off: its groups are lost now, not at closes_at
                await asyncio.to_thread(self.store.close_groups, r.number, replicas=gone, fence=self._lease())
                log_event("groups_written_off", logging.WARNING, round=r.number, replicas=",".join(sorted(gone)),
                          why="the replica left the tier (its membership expired or was taken over)")
                rows = await asyncio.to_thread(self.store.round_groups, r.number)
            r.update(rows)
            if r.phase is not saved and r.phase.is_collecting:
                saved = r.phase
                await asyncio.to_thread(self.store.save_round_progress, self._record(r, saved))

    def _departed(self, rows: Sequence[GroupRow]) -> set[str]:
        """The replicas of `rows`' open groups whose membership term is over
        (no live member of that name and term): nothing will run them."""
        open_rows = [g for g in rows if not g.state.is_final]
        if not open_rows:
            return set()
        live = {(m.name, m.token) for m in self.store.live_replicas()}
        return {g.assignment.replica for g in open_rows
                if (g.assignment.replica, g.assignment.replica_token) not in live}

    # ------------------------------------------------------------------ 5. finish

    async def _close_and_read(self, r: RemoteRound, lease: Lease) -> list[GroupRow]:
        """Close the round's open groups (fenced), then read every row with
        its sum: after the close no row moves, so the rows say which groups
        may have asked (D94's race, decided by the store)."""
        await asyncio.to_thread(self.store.close_groups, r.number, fence=lease)
        rows = await asyncio.to_thread(self.store.round_groups, r.number, sums=True)
        r.update(rows)
        return rows

    async def finish(self, r: RemoteRound) -> None:
        """Close the open groups, add the done sums, commit or abort (step 5)."""
        lease = self._lease()
        rows = await self._close_and_read(r, lease)
        self.deadlines.observe(r.completion)  # the replicas' own stage times: the next deadlines learn from them
        result = r.combine({g.index: g for g in rows})
        counted = len(result.counted) if result is not None else 0
        if result is None or counted < r.plan.minimum:
            why = (f"too_few_survivors: {counted} devices counted over the groups, minimum {r.plan.minimum}"
                   if result is not None else "no group reached aggregation")
            await self._abort(r, P.ABORT_REASON_TOO_FEW_SURVIVORS, why, lease)
            return
        async with self.current.lock:  # a rollback waits for the commit, or the commit sees it
            if self.current.version != r.plan.model_version:
                await self._abort(r, P.ABORT_REASON_CANCELLED, "the model was rolled back during the round", lease)
                return
            new_params, version = await self.current.stepped(result.decoded_mean)
            metrics = self._metrics(r)
            privacy = await asyncio.to_thread(self.ledger.entry_for, _as_round(r))
            r.ended(RoundState.COMMITTED)
            record = self._record(r, RoundState.COMMITTED, metrics=metrics, ended=True)
            summary = await asyncio.to_thread(self.store.commit_round, record, version, privacy, fence=lease)
            self.current.adopt(summary.id, new_params, self.current.step + 1)
        r.ended(RoundState.COMMITTED, new_model_version=summary.id)
        self.ledger.committed(privacy)
        self.previous_contributors = frozenset(result.counted)
        log_event("round_committed", round=r.number, version=summary.id, contributors=counted,
                  groups=len(r.released()), epsilon=f"{privacy.epsilon:.4g}" if privacy else "none")

    async def _abort(self, r: RemoteRound, reason: P.AbortReason.ValueType, detail: str, lease: Lease) -> None:
        """Abort `r`, fenced, with the charge of every group whose sum the
        server may know (`abort_charge` over `RemoteRound`'s groups)."""
        r.ended(RoundState.ABORTED, reason=reason, detail=detail)
        record = self._record(r, RoundState.ABORTED, ended=True)

        def charge_and_abort() -> PrivacyEntry | None:
            entry = abort_charge(self.ledger, _as_round(r), self.store.privacy_ledger()) if self.ledger.enabled else None
            self.store.abort_round(record, fence=lease, privacy_entry=entry)
            return entry

        entry = await asyncio.to_thread(charge_and_abort)
        if entry is not None:
            self.ledger.committed(entry)
        log_event("round_aborted", logging.WARNING, round=r.number, reason=reason_name(reason), detail=detail,
                  charged=f"{entry.epsilon:.4g}" if entry else "none")

    # ------------------------------------------------------------------ records

    def _metrics(self, r: RemoteRound) -> dict[str, float]:
        try:
            out = round_metrics(_as_round(r), model_name=self.model.name, debug=self.settings.debug)
        except Exception as exc:  # a report must never fail a commit: commit without metrics
            log_event("metrics_dropped", logging.ERROR, round=r.number, error=f"{type(exc).__name__}: {exc}")
            out = {}
        return out

    def _record(self, r: RemoteRound, state: RoundState, *, metrics: Mapping[str, float] | None = None,
                ended: bool = False) -> RoundRecord:
        """The round's record in `state`, with the tier's figures among its
        metrics: `devices_left_out` (the plan's) and `replica_groups.<name>`
        (groups each replica runs)."""
        tier = {"devices_left_out": float(r.plan.devices_left_out),
                **{f"replica_groups.{k}": float(v) for k, v in r.groups_by_replica().items()}}
        return round_record(_as_round(r), state, started_at=r.plan.opened_at, ended_at=self._wall() if ended else None,
                            base_model_version=r.plan.model_version, metrics={**tier, **(metrics or {})})


def _rows(plan: RoundPlan, machine: AnyRound, per_group: tuple[TaskFields, ...],
          members: list[Lease]) -> list[GroupAssignment]:
    """Each group's row: its bound config and DpSettings, its replica's term."""
    machines = machine.machines if isinstance(machine, GroupedRoundMachine) else (machine,)
    return [assignment_for(plan, j, member, m.cohort, m.config, f.dp)
            for j, (m, f, member) in enumerate(zip(machines, per_group, members, strict=True))]


def _assigned(a: GroupAssignment) -> GroupRow:
    """A row as the plan writes it (assigned, nothing saved)."""
    return new_group_row(a, time.time())


def _as_round(r: RemoteRound) -> AnyRound:
    """`r` where the reporting functions take a round machine: `RemoteRound`
    gives every member they read (remote_round's module doc); the type
    checker cannot see that a structural view is one of the two machines."""
    return r  # type: ignore[return-value]


__all__ = ["RoundPlanner", "Selection"]
