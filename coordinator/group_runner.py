"""A replica's side of rounds in groups (D99): run the groups the leader
assigned to this replica, over the device streams this replica holds, and
write each group's outcome to the store.

`GroupRunner.run()` polls `store.assigned_groups(member())` every `poll_s`
seconds and runs one round at a time (a stream carries one round), all of
this replica's groups of it together, as one local `GroupedRoundMachine`
(`assignment.local_round`). For a round:

1. every group is started (`start_group`), then rebuilt from its row
   (`assignment.stored_group`) and the model version's parameters
   (`model_cache.ModelCache`); a group whose stored session id is not the
   one its task binds to fails with `binding_mismatch`, one whose settings
   or model cannot be read with `settings_refused` or `model_unavailable`:
   no task of such a group goes out;
2. the other groups' RoundTasks go out (`RoundDelivery.send_tasks`), and the
   machine is driven exactly as the in-process round loop drives a round
   (round_loop.py): ticked on its deadline or when it wants to close, each
   group's stage change saved (`save_group_progress`, state `running`);
3. before any unmasking request goes out, every group that asks is saved in
   state `unmasking` with the devices it asks (`unmasking_guard.save_then_ask`
   with that save): when the save is refused no request goes out (D94, group
   by group);
4. when no group collects any more, each group is finished (`finish_group`:
   `done` with its sum, or `failed` with its reason), and the runner waits
   on the round's outcome (`round_outcome`): committed -> the counted
   groups' devices get RoundCommitted (the machine's `committed`); aborted,
   unknown, one of this replica's done groups lost, or the plan's
   `closes_at` passed -> every device still in the round gets an
   AbortNotice (the machine's `cancel`).

A `FencedOut` (this replica's term is over) or `GroupClosed` (the leader
closed the group or ended the round) on any write cancels the local round
quietly: its devices get an AbortNotice, nothing more is written (the store
wrote nothing), and no unmasking request goes out after it.

Wiring (the host, on the same event loop): stage messages of the devices of
`runner.round` go to `runner.round.handle(...)` and the actions to
`runner.apply`; a lost device to `device_lost`; then `runner.wake` is set.
A host that routes them itself (service.py's `Coordinator`, whose
`_on_stage_message` reads its `round`) passes its own `apply` and `wake`
event and an `on_round` callback that publishes the local machine (None
between rounds).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from google.protobuf.message import DecodeError

from coordinator.assignment import (
    BINDING_MISMATCH,
    StoredGroup,
    binding_matches,
    group_mechanism,
    group_result,
    local_round,
    round_metrics,
    stored_group,
)
from coordinator.grouped_rounds import GroupedRoundMachine
from coordinator.logs import log_event
from coordinator.model_cache import ModelCache, ModelMismatch
from coordinator.registry import DeviceRegistry
from coordinator.round_delivery import RoundDelivery
from coordinator.round_tasks import TaskFields
from coordinator.rounds import Action, Broadcast, LogEvent, Send
from coordinator.store import (
    FencedOut,
    GroupAssignment,
    GroupClosed,
    GroupProgress,
    GroupResult,
    GroupState,
    Lease,
    NotFoundError,
    RoundPlan,
    RoundState,
    Store,
    utc_now,
)
from coordinator.unmasking_guard import UNMASKING_REQUEST, opens_unmasking, save_then_ask
from fedmask_proto.v1 import common_pb2
from wire.errors import WireError

P = common_pb2
SETTINGS_REFUSED = "settings_refused"
MODEL_UNAVAILABLE = "model_unavailable"


@dataclass(frozen=True, slots=True)
class _Ready:
    """A group rebuilt and checked: it runs."""

    group: StoredGroup
    fields: TaskFields


class _Quiet(Exception):
    """The store refused a write (FencedOut, GroupClosed): end quietly."""


class GroupRunner:
    """See the module doc. `member()`: this replica's membership term (e.g.
    `MembershipKeeper.member`)."""

    def __init__(self, store: Store, member: Callable[[], Lease], delivery: RoundDelivery,
                 registry: DeviceRegistry, models: ModelCache, *, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], datetime] = utc_now, poll_s: float = 0.2,
                 wake: asyncio.Event | None = None, apply: Callable[[Iterable[Action]], None] | None = None,
                 on_round: Callable[[GroupedRoundMachine | None], None] | None = None) -> None:
        self.store = store
        self._member = member
        self.delivery = delivery
        self.registry = registry
        self.models = models
        self._clock = clock
        self._wall = wall_clock
        self.poll_s = poll_s
        self.wake = wake if wake is not None else asyncio.Event()  # set when the local round may have moved
        self._host_apply = apply
        self._on_round = on_round
        self._stop = asyncio.Event()
        self.round: GroupedRoundMachine | None = None  # the local round (None between rounds)
        self._index: tuple[int, ...] = ()  # machine group j -> the group's index in the round
        self.rounds_run = 0

    # ------------------------------------------------------------------ the loop

    def stop(self) -> None:
        """End `run()` after the round in progress (a round waiting on its outcome is cancelled)."""
        self._stop.set()
        self.wake.set()

    async def run(self) -> None:
        """Run this replica's groups until `stop()`."""
        while not self._stop.is_set():
            try:
                rows = await asyncio.to_thread(self.store.assigned_groups, self._member())
                if rows:
                    number = rows[0].round_number
                    await self.run_round(number, [r.assignment for r in rows if r.round_number == number])
                    self.rounds_run += 1
                    continue
            except FencedOut:
                log_event("group_runner_fenced_out", logging.WARNING)
            except Exception as exc:  # a store outage, a bug: log it, back off, go on
                log_event("group_runner_error", logging.ERROR, error=f"{type(exc).__name__}: {exc}")
                logging.getLogger("fedmask.coordinator").debug("group runner error", exc_info=True)
            await self._sleep(self.poll_s)

    async def run_round(self, number: int, assignments: Sequence[GroupAssignment]) -> None:
        """Run these groups (of round `number`, all assigned to this replica)
        to their outcome (the module doc)."""
        member = self._member()
        assignments = sorted(assignments, key=lambda a: a.index)
        try:
            plan = await asyncio.to_thread(self.store.round_plan, number)
            for a in assignments:
                await asyncio.to_thread(self.store.start_group, member, number, a.index)
        except (FencedOut, GroupClosed) as exc:
            log_event("groups_refused", round=number, why=f"{type(exc).__name__}: {exc}")
            return
        if plan is None:
            return  # a plan is written with its groups: there is none to run
        ready, failed = await self._rebuild(plan, assignments)
        try:
            for a, why in failed:
                await self._fail(member, number, a.index, why)
            if not ready:
                return
            try:
                r = local_round([g.group for g in ready], plan, identity=self._identity(ready),
                                metrics=ready[0].fields.metrics)
            except (ValueError, WireError, KeyError) as exc:
                log_event("groups_refused", logging.ERROR, round=number, why=f"{type(exc).__name__}: {exc}")
                for g in ready:
                    await self._fail(member, number, g.group.assignment.index, SETTINGS_REFUSED)
                return
        except _Quiet:
            return
        self._publish(r, tuple(g.group.assignment.index for g in ready))
        try:
            await self._drive(r, plan, ready, member)
        finally:
            self._publish(None, ())

    # ------------------------------------------------------------------ one round

    async def _rebuild(self, plan: RoundPlan, assignments: Sequence[GroupAssignment]
                       ) -> tuple[list[_Ready], list[tuple[GroupAssignment, str]]]:
        """Each group rebuilt and checked (step 1 of the module doc)."""
        ready: list[_Ready] = []
        failed: list[tuple[GroupAssignment, str]] = []
        for a in assignments:
            try:
                g = stored_group(a)
                metrics = round_metrics(plan, g)
                group_mechanism(plan, g, metrics)
                fields = await asyncio.to_thread(self.models.task_fields, plan, g.dp, metrics)
            except (NotFoundError, ModelMismatch) as exc:
                failed.append((a, MODEL_UNAVAILABLE))
                log_event("group_refused", logging.ERROR, round=a.round_number, group=a.index, error=str(exc))
                continue
            except (WireError, DecodeError, ValueError) as exc:
                failed.append((a, SETTINGS_REFUSED))
                log_event("group_refused", logging.ERROR, round=a.round_number, group=a.index, error=str(exc))
                continue
            if not await asyncio.to_thread(binding_matches, g, plan, fields):
                failed.append((a, BINDING_MISMATCH))
                log_event("group_refused", logging.ERROR, round=a.round_number, group=a.index,
                          error="its session id does not bind the task the plan gives")
                continue
            ready.append(_Ready(g, fields))
        return ready, failed

    def _identity(self, ready: Sequence[_Ready]) -> dict[int, bytes] | None:
        if not ready[0].group.config.active_adversary:
            return None
        return {d: self.registry.devices[d].identity_public_key for g in ready for d in g.group.assignment.members}

    async def _drive(self, r: GroupedRoundMachine, plan: RoundPlan, ready: Sequence[_Ready], member: Lease) -> None:
        """Steps 2-4 of the module doc."""
        number = r.number
        saved: dict[int, RoundState] = {}
        try:
            self.delivery.new_round()
            for m, g in zip(r.machines, ready, strict=True):
                self.delivery.send_tasks(
                    m.cohort, functools.partial(g.fields.task, m, deadlines=dict(plan.task_deadlines)),
                    gone=lambda d: self.apply(r.device_lost(d, self._clock(), "gone before the round task")))
            self.apply(r.start(self._clock()))
            await self._save_stages(member, r, saved)
            while r.phase.is_collecting and not self._stop.is_set():
                timeout = r.deadline - self._clock()
                if not (r.wants_close or timeout <= 0):
                    await self._wait(timeout)
                    continue
                actions = r.tick(self._clock())
                if opens_unmasking(actions):  # who is asked is saved, group by group, before anyone is asked (D94)
                    await save_then_ask(functools.partial(self._save_unmasking, member, r, actions, saved),
                                        actions, self.apply)
                else:
                    self.apply(actions)
                await self._save_stages(member, r, saved)
            if r.phase.is_collecting:  # stopped
                self.apply(r.cancel(P.ABORT_REASON_COORDINATOR_SHUTDOWN, "replica shutting down", self._clock()))
            for j, index in enumerate(self._index):
                reason = "replica_shutdown" if self._stop.is_set() and not r.machines[j].result else None
                await self._finish(member, group_result(r, j, index, reason=reason))
        except (FencedOut, GroupClosed, _Quiet) as exc:
            log_event("groups_closed", round=number, why=f"{type(exc).__name__}: {exc}")
            self.apply(r.cancel(P.ABORT_REASON_CANCELLED, "the round's groups were closed", self._clock()))
            return
        except Exception:
            self.apply(r.cancel(P.ABORT_REASON_CANCELLED, "internal coordinator error", self._clock()))
            for j, index in enumerate(self._index):  # try to leave a record
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self.store.finish_group, member,
                                            group_result(r, j, index, reason="replica_error"))
            raise
        if r.phase is RoundState.AGGREGATING:
            await self._await_outcome(r, plan)

    async def _await_outcome(self, r: GroupedRoundMachine, plan: RoundPlan) -> None:
        """Poll the round's outcome: commit or cancel the local round."""
        mine = {index for j, index in enumerate(self._index) if r.machines[j].result is not None}
        while True:
            outcome = await asyncio.to_thread(self.store.round_outcome, r.number)
            if outcome is not None and outcome.state is RoundState.COMMITTED and outcome.new_model_version:
                self.apply(r.committed(outcome.new_model_version, self._clock()))
                return
            why = None
            if outcome is None or outcome.state.is_terminal:
                why = f"the round ended {outcome.abort_reason if outcome else 'unknown'}"
            elif any(g.index in mine and g.state is GroupState.LOST
                     for g in await asyncio.to_thread(self.store.round_groups, r.number)):
                why = "the leader closed the group"
            elif self._wall() > plan.closes_at:
                why = "the round closed without an outcome"
            elif self._stop.is_set():
                why = "replica shutting down"
            if why is not None:
                log_event("groups_cancelled", round=r.number, why=why)
                self.apply(r.cancel(P.ABORT_REASON_CANCELLED, why, self._clock()))
                return
            await self._sleep(self.poll_s)

    # ------------------------------------------------------------------ saves

    def _progress(self, r: GroupedRoundMachine, j: int, state: GroupState,
                  asked: tuple[int, ...] | None = None) -> GroupProgress:
        m = r.machines[j]
        return GroupProgress(
            round_number=r.number, index=self._index[j], state=state, phase=m.phase.value, asked=asked,
            survivors=m.survivors(), dropouts=m.dropout_ids(), timings=dict(m.timings),
            share_reports=tuple((a, b) for a, bad in m.share_reports().items() for b in bad),
            share_check_survivors=tuple(m.share_check_survivors()))

    def _save_unmasking(self, member: Lease, r: GroupedRoundMachine, actions: Sequence[Action],
                        saved: dict[int, RoundState]) -> None:
        """Blocking: each group asking in `actions` saved in `unmasking`
        with the devices it asks (a GroupClosed or FencedOut propagates)."""
        asked: dict[int, set[int]] = {}
        for a in actions:
            targets = (a.device_id,) if isinstance(a, Send) else a.device_ids if isinstance(a, Broadcast) else ()
            if targets and a.message.WhichOneof("message") == UNMASKING_REQUEST:  # type: ignore[union-attr]
                for d in targets:
                    j = r.group_of(d)
                    if j is not None:
                        asked.setdefault(j, set()).add(d)
        for j in sorted(asked):
            self.store.save_group_progress(member, self._progress(r, j, GroupState.UNMASKING, tuple(sorted(asked[j]))))
            saved[j] = RoundState.UNMASKING

    async def _save_stages(self, member: Lease, r: GroupedRoundMachine, saved: dict[int, RoundState]) -> None:
        """Each collecting group whose stage changed since its last save, saved `running`."""
        for j, m in enumerate(r.machines):
            if m.phase.is_collecting and m.phase is not RoundState.UNMASKING and saved.get(j) is not m.phase:
                await self._save(member, self._progress(r, j, GroupState.RUNNING))
                saved[j] = m.phase

    async def _save(self, member: Lease, progress: GroupProgress) -> None:
        await asyncio.to_thread(self.store.save_group_progress, member, progress)

    async def _finish(self, member: Lease, result: GroupResult) -> None:
        await asyncio.to_thread(self.store.finish_group, member, result)

    async def _fail(self, member: Lease, number: int, index: int, why: str) -> None:
        try:
            await asyncio.to_thread(self.store.finish_group, member, GroupResult(
                round_number=number, index=index, state=GroupState.FAILED, fail_reason=why))
        except (FencedOut, GroupClosed) as exc:
            raise _Quiet(str(exc)) from exc

    # ------------------------------------------------------------------ actions and waits

    def apply(self, actions: Iterable[Action]) -> None:
        """Route the local machine's actions: its log events name each
        group by its index in the round; then the host's `apply`, or the
        runner's own routing (messages to the streams, log lines, a wake-up
        on any change of the round)."""
        out = [LogEvent(a.event, {**a.fields, "group": self._index[a.fields["group"]]})
               if isinstance(a, LogEvent) and isinstance(a.fields.get("group"), int)
               and 0 <= a.fields["group"] < len(self._index) else a for a in actions]
        if self._host_apply is not None:
            self._host_apply(out)
            return
        for a in out:
            if isinstance(a, Send):
                self.delivery.send(a.device_id, a.message)
            elif isinstance(a, Broadcast):
                self.delivery.broadcast(a.device_ids, a.message)
            elif isinstance(a, LogEvent):
                log_event(a.event, **a.fields)
            else:
                self.wake.set()

    def _publish(self, r: GroupedRoundMachine | None, index: tuple[int, ...]) -> None:
        self.round, self._index = r, index
        if self._on_round is not None:
            self._on_round(r)

    async def _wait(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout)
        self.wake.clear()

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)


__all__ = ["GroupRunner", "MODEL_UNAVAILABLE", "SETTINGS_REFUSED"]
