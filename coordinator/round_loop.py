"""The coordinator's round loop in one process: wait while held, select a
cohort, plan and build the round (one machine, or one per group), send its
tasks, drive it to its end on the round's wake-ups and deadlines, save its
progress, commit it or record its abort.

`InProcessRounds` is a mixin of `service.Coordinator`, not a part it
composes: the loop writes the state of the running round (`round`, its
timeline, start and base version) that the coordinator's own handlers read
on the same event loop (stage messages, a device lost, a cancel, the
shutdown, the live view), it waits on wake-ups those handlers set, and it
uses a dozen of the coordinator's parts. Composed, it would need either a
reference back to the coordinator or a constructor of some twenty
arguments, plus properties forwarding `round`, `rounds_run`, `eligible`
and `run`; as a mixin the loop reads as before and the coordinator keeps
its surface. The contract between the two:

- the loop owns (sets up in `__init__`, which the host calls first) the
  running round and its record fields, the previous round's contributors,
  the highest round number it ran, `rounds_run`, and four wake-ups:
  `_changed` (devices or the federation changed: selection looks again),
  `_round_event` (the round may have moved: the loop ticks it),
  `_stop_event` (shutdown) and `_held` (pause, budget or a rollback may
  have changed). The host sets them (the loop, too, sets `_changed` when
  a round ends); only the loop waits on them and clears them.
- the host provides the attributes annotated on the class (its settings,
  store, model and parts, its clocks and randomness, and its control
  state: started, stopping, paused, rollbacks in progress) and the
  abstract members: `model_version`, `budget_exhausted`, `start()` and
  `_apply(actions)`, which routes a machine's actions (messages to the
  streams, log lines, a phase change back into `_phase_changed`, wake-ups).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime

from coordinator.aggregate import AggregateResult
from coordinator.current_model import CurrentModel
from coordinator.events import EventHub
from coordinator.grouped_rounds import AnyRound, Grouped
from coordinator.live_state import RoundTimeline, stage_changed
from coordinator.logs import log_event
from coordinator.metrics import CoordinatorMetrics
from coordinator.model_host import ServerModel
from coordinator.registry import DeviceRegistry
from coordinator.report_ledger import ReportLedger
from coordinator.round_delivery import RoundDelivery
from coordinator.round_groups import round_groups
from coordinator.round_machines import build_round, plan_groups
from coordinator.round_outcomes import RoundOutcomes
from coordinator.round_policy import AdaptiveDeadlines, round_plan
from coordinator.round_report import PrivacyLedger, round_metrics, round_record
from coordinator.round_tasks import TaskFields
from coordinator.rounds import Action, RoundMachine
from coordinator.selection import eligible_devices, select_cohort
from coordinator.settings import CoordinatorSettings
from coordinator.spent_devices import SpentDevices
from coordinator.store import RoundRecord, RoundState, Store
from coordinator.unmasking_guard import opens_unmasking, save_then_ask
from coordinator.version_skip import VersionSkip
from fedmask_proto.v1 import common_pb2
from secagg.errors import SecAggConfigError


class InProcessRounds(ABC):
    """The round loop (see the module doc): `run()` runs rounds until
    `settings.rounds` are done or the host shuts down."""

    # Provided by the host (service.Coordinator).
    settings: CoordinatorSettings
    store: Store
    model: ServerModel
    registry: DeviceRegistry
    current: CurrentModel
    ledger: PrivacyLedger
    outcomes: RoundOutcomes
    spent: SpentDevices
    peer_reports: ReportLedger
    skip: VersionSkip
    deadlines: AdaptiveDeadlines
    delivery: RoundDelivery
    metrics: CoordinatorMetrics
    events: EventHub
    paused: bool
    _clock: Callable[[], float]
    _wall: Callable[[], datetime]
    _rng: random.Random
    _token: Callable[[int], bytes]
    _started: bool
    _stopping: bool
    _rollbacks: int  # rollbacks in progress: the loop opens no round meanwhile

    def __init__(self) -> None:
        self.round: AnyRound | None = None  # the running round (None between rounds)
        self._round_started_at: datetime | None = None
        self._round_base: int | None = None  # the model version the running round started from
        self._timeline = RoundTimeline()
        self._previous_contributors: frozenset[int] = frozenset()
        self._last_round_number = 0
        self.rounds_run = 0
        self._changed = asyncio.Event()
        self._stop_event = asyncio.Event()
        self._round_event = asyncio.Event()
        self._held = asyncio.Event()  # set when paused / budget_exhausted may have changed

    @property
    @abstractmethod
    def model_version(self) -> int | None:
        """The current model version (None before the start)."""

    @property
    @abstractmethod
    def budget_exhausted(self) -> bool:
        """Whether the epsilon budget holds the federation (D42)."""

    @abstractmethod
    async def start(self) -> None:
        """Recover and load (`run` calls it when the host did not)."""

    @abstractmethod
    def _apply(self, actions: Iterable[Action]) -> None:
        """Route a round machine's actions (see the module doc)."""

    def eligible(self) -> list[int]:
        """Devices selectable now; quarantine (D37) never leaves fewer than the cohort minimum."""
        c = self.settings.cohort
        free = eligible_devices(self.registry.available(self.model.name),
                                busy=set(() if self.round is None else self.round.cohort) | self.spent.devices,
                                previous_contributors=self._previous_contributors,
                                allow_consecutive=c.allow_consecutive)
        out = self.peer_reports.excluded(free, max(c.minimum, 2))
        return [d for d in free if d not in out]

    async def _wait(self, event: asyncio.Event, timeout: float) -> None:
        if timeout > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout)
        event.clear()

    async def run(self) -> None:
        """Run rounds until `settings.rounds` are done or shutdown()."""
        if not self._started:
            await self.start()
        limit = self.settings.rounds
        while not self._stopping and (limit is None or self.rounds_run < limit):
            await self._hold()
            if self._stopping:
                break
            try:
                cohort = await self._select()
                if self._stopping:
                    break
                if self.paused or self._rollbacks:  # paused / rolled back during selection: open nothing
                    continue
                if cohort is not None:
                    await self._run_round(cohort)
            except Exception as exc:  # a store outage, a bug: log it, back off, go on
                log_event("round_loop_error", logging.ERROR, error=f"{type(exc).__name__}: {exc}")
                logging.getLogger("fedmask.coordinator").debug("round loop error", exc_info=True)
                await self._wait(self._stop_event, 1.0)
            self.rounds_run += 1
            if self.settings.cohort.pause > 0 and not self._stopping:
                await self._wait(self._stop_event, self.settings.cohort.pause)
        log_event("round_loop_stopped", rounds=self.rounds_run)

    async def _hold(self) -> None:
        """Wait while an operator paused the federation or the budget is exhausted."""
        while not self._stopping and (self.paused or self.budget_exhausted or self._rollbacks):
            await self._wait(self._held, 1.0)

    async def _select(self) -> list[int] | None:
        c = self.settings.cohort
        minimum = max(c.minimum, 2)
        target = max(c.selected, minimum)
        await self._refresh_exclusions()
        while not self._stopping and len(eligible := self.eligible()) < minimum:
            available = self.registry.available(self.model.name)
            if not await self.skip.step(self.spent, available, eligible=len(eligible), minimum=minimum):  # D94
                self.spent.waiting(available, eligible=len(eligible), minimum=minimum)
                await self._wait(self._changed, 1.0)
            await self._refresh_exclusions()
        if self._stopping:
            return None
        window_end = self._clock() + self.settings.deadlines.selection
        while not self._stopping and len(self.eligible()) < target and self._clock() < window_end:
            await self._wait(self._changed, min(1.0, window_end - self._clock()))
        if self._stopping:
            return None
        cohort = select_cohort(self.eligible(), target=target, minimum=minimum, rng=self._rng)
        if cohort is None:
            number = await asyncio.to_thread(self.store.next_round_number)
            await self.outcomes.record_abort_only(number, common_pb2.ABORT_REASON_NOT_ENOUGH_DEVICES,
                                                  "devices left during selection", base_version=self.model_version)
        return cohort

    async def _refresh_exclusions(self) -> None:  # both read the store (several replicas share it)
        await self.peer_reports.refresh(self._last_round_number + 1)
        await self.spent.refresh(self.model_version)

    def _record(self, r: AnyRound, state: RoundState, *, ended: bool = False,
                metrics: Mapping[str, float] | None = None, timings: Mapping[str, float] | None = None) -> RoundRecord:
        return round_record(r, state, started_at=self._round_started_at or self._wall(),
                            ended_at=self._wall() if ended else None, base_model_version=self._round_base,
                            metrics=metrics, timings=timings)

    async def _run_round(self, cohort: list[int]) -> None:
        session_id = self._token(16)
        plaintext = self.settings.debug.insecure_plaintext
        try:  # the secagg config, the metric layout and the discrete Gaussian (D88) of this cohort, per group (D99)
            config, metrics, mechanism = round_plan(self.settings, len(cohort), self.model.update_dim, session_id,
                                                    self.model.metric_names, plaintext=plaintext)
            groups = round_groups(self.settings.secagg.group_size, cohort, session_id, self.registry.owner)
            plans = plan_groups(self.settings, config, groups, mechanism)
        except (SecAggConfigError, ValueError) as exc:
            number = await asyncio.to_thread(self.store.next_round_number)
            await self.outcomes.record_abort_only(number, common_pb2.ABORT_REASON_NOT_ENOUGH_DEVICES, str(exc),
                                                  base_version=self.model_version, cohort_size=len(cohort))
            return
        budget = self.ledger.budget
        if budget is not None:  # priced at the fewest devices a committed group can count
            worst = max([await asyncio.to_thread(self.ledger.epsilon_after, cohort=len(p.members),
                                                 counted=p.config.threshold, mechanism=p.mechanism) for p in plans])
            if worst > budget:
                await self.outcomes.exhaust_budget(worst, paused=self.paused, model_version=self.model_version,
                                                   cohort_size=len(cohort))
                return
        number = await asyncio.to_thread(self.store.next_round_number)
        fields = TaskFields.for_round(self.settings, self.model, self.current, self.model_version or 0, len(cohort), metrics,
                                      mechanism)
        identity = None
        self.delivery.new_round()
        if config.active_adversary:
            identity = {d: self.registry.devices[d].identity_public_key for d in cohort}
        windows = self.deadlines.windows(active=config.active_adversary, cohort=len(cohort))
        r, task_fields = await asyncio.to_thread(lambda: build_round(
            self.settings, number=number, nonce=session_id, plans=plans, minimum=config.threshold,
            deadlines=windows.machine, identity=identity, metrics=metrics, fields=fields))
        self.round = r
        self._round_started_at = self._wall()
        self._round_base = self.model_version
        self._timeline = RoundTimeline()
        log_event("round_started", round=number, cohort=len(cohort), config=r.config.describe(),
                  model=self.model.name, version=self.model_version,
                  deadlines=",".join(f"{k}={v:.2f}" for k, v in windows.machine.items()))
        try:
            await asyncio.to_thread(self.store.save_round_progress, self._record(r, r.phase))
            self._send_tasks(r, windows.task, task_fields)
            self._apply(r.start(self._clock()))
            saved_phase = r.phase
            while r.phase.is_collecting:
                timeout = r.deadline - self._clock()
                if not (r.wants_close or timeout <= 0):
                    await self._wait(self._round_event, timeout)
                    continue
                actions = r.tick(self._clock())
                if opens_unmasking(actions) and r.phase is RoundState.UNMASKING:  # who is asked to unmask is saved before anyone is asked (D94)
                    await save_then_ask(functools.partial(self.store.save_round_progress, self._record(r, r.phase)),
                                        actions, self._apply)
                    saved_phase = r.phase
                else:
                    self._apply(actions)
                if r.phase.is_collecting and r.phase is not saved_phase:
                    saved_phase = r.phase
                    await asyncio.to_thread(self.store.save_round_progress, self._record(r, r.phase))
            self.deadlines.observe(r.completion)
            if isinstance(r, RoundMachine) and r.surplus is not None:  # removable noise (D110)
                await self._remove_surplus(r)
            if r.phase is RoundState.AGGREGATING:
                await self._commit(r)
            if r.phase is RoundState.ABORTED:
                await self.outcomes.save_abort(r, self._record(r, RoundState.ABORTED, ended=True))
                self.outcomes.round_over(r, started_at=self._round_started_at or self._wall())
        except Exception:
            if not r.phase.is_terminal:  # tell the cohort; try to leave a record
                self._apply(r.cancel(common_pb2.ABORT_REASON_CANCELLED, "internal coordinator error", self._clock()))
                with contextlib.suppress(Exception):
                    await self.outcomes.save_abort(r, self._record(r, RoundState.ABORTED, ended=True))
                self.outcomes.round_over(r, started_at=self._round_started_at or self._wall())
            raise
        finally:
            self._last_round_number = max(self._last_round_number, number)
            reports = r.share_reports()
            if reports:
                await self.peer_reports.record(number, reports, survivors=r.share_check_survivors())
            self.round = None
            self.metrics.live_round(survivors=0, threshold=0, cohort=0)
            self._changed.set()

    def _phase_changed(self, phase: RoundState) -> None:
        """The running round entered `phase`: its timeline, the stage event
        (collecting stages and aggregating; the end has its own events) and
        the live gauges."""
        r = self.round
        if r is None or r.phase is not phase:
            return
        closed = self._timeline.open(phase.value, at=self._wall(), deadline_in=r.deadline - self._clock())
        self.metrics.live_round(survivors=len(r.live_devices()), threshold=r.config.threshold, cohort=len(r.cohort))
        if not phase.is_terminal:
            self.events.publish(stage_changed=stage_changed(r, self._timeline, closed))

    def _send_tasks(self, r: AnyRound, deadlines: dict[str, float], fields: tuple[TaskFields, ...]) -> None:
        """Each group's tasks (a round of one instance: one group) to the streams hosting its devices."""
        for m, f in zip(r.machines if isinstance(r, Grouped) else (r,), fields, strict=True):
            self.delivery.send_tasks(m.cohort, functools.partial(f.task, m, deadlines=deadlines),
                                     gone=lambda d: self._apply(r.device_lost(d, self._clock(), "gone before the round task")))

    async def _remove_surplus(self, r: RoundMachine) -> None:
        """Removable noise (D110): regenerate and subtract the counted
        devices' surplus on a worker thread (seconds to minutes of exact
        draws; the event loop keeps serving), then hand the result over."""
        surplus = r.surplus
        assert surplus is not None
        t0 = self._clock()
        try:
            result: AggregateResult | None = await asyncio.to_thread(surplus.run)
            detail = ""
        except ValueError as exc:  # the rebuilt seeds are not the counted devices' removed components
            result, detail = None, str(exc)
        seconds = self._clock() - t0
        if result is not None:
            log_event("surplus_removed", round=r.number, components=surplus.regenerated, seconds=round(seconds, 3))
        else:
            log_event("surplus_removal_failed", logging.ERROR, round=r.number, components=surplus.regenerated,
                      error=detail)
        self._apply(r.surplus_removed(result, detail, seconds=seconds))

    async def _commit(self, r: AnyRound) -> None:
        result = r.result
        assert result is not None
        t0 = self._clock()
        current = self.current
        async with current.lock:  # a rollback waits for the commit, or the commit sees it
            if self.model_version != self._round_base:
                log_event("commit_failed", logging.WARNING, round=r.number, error="the model was rolled back")
                self._apply(r.commit_failed("the model was rolled back during the round", self._clock()))
                return
            try:
                new_params, version = await current.stepped(result.decoded_mean)
                try:
                    metrics = round_metrics(r, model_name=self.model.name, debug=self.settings.debug)
                except Exception as exc:  # a report must never fail a commit: commit without metrics
                    log_event("metrics_dropped", logging.ERROR, round=r.number, error=f"{type(exc).__name__}: {exc}")
                    metrics = {}
                privacy = await asyncio.to_thread(self.ledger.entry_for, r)
                removal_s = r.removal_s if isinstance(r, RoundMachine) else 0.0  # removable noise (D110)
                timings = {**r.timings, RoundState.AGGREGATING.value: self._clock() - t0 + removal_s}
                record = self._record(r, RoundState.COMMITTED, ended=True, metrics=metrics, timings=timings)
                summary = await asyncio.to_thread(self.store.commit_round, record, version, privacy)
                current.adopt(summary.id, new_params, current.step + 1)
            except Exception as exc:  # the model step or the store failed: the round is lost, not the service
                log_event("commit_failed", logging.ERROR, round=r.number, error=f"{type(exc).__name__}: {exc}")
                self._apply(r.commit_failed(f"{type(exc).__name__}", self._clock()))
                return
        self.outcomes.spent(privacy)
        self._previous_contributors = frozenset(result.counted)
        self._apply(r.committed(summary.id, self._clock()))
        self.outcomes.round_over(r, started_at=self._round_started_at or self._wall(), new_version=summary.id)


__all__ = ["InProcessRounds"]
