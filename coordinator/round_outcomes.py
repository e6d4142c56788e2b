"""How the federation's rounds ended, and its epsilon budget: the counts of
committed and aborted rounds since the start, the epsilon spent, whether
the budget holds the round loop for good (D42), and the metrics, events and
round records that announce each end.

`RoundOutcomes` is composed by the `Coordinator` (service.py), which tells
it each round's end; it never touches a running round. `on_hold` is called
when the budget becomes exhausted (the round loop re-checks its hold).
Every method runs on the coordinator's event loop; store calls go to worker
threads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime

from coordinator.events import EventHub
from coordinator.interrupted_charge import abort_charge
from coordinator.logs import log_event
from coordinator.metrics import CoordinatorMetrics
from coordinator.round_report import PrivacyLedger
from coordinator.grouped_rounds import AnyRound
from coordinator.store import PrivacyEntry, RoundRecord, RoundState, Store
from fedmask_proto.v1 import admin_service_pb2, common_pb2
from wire.round_task import seconds_to_duration
from wire.secagg_codec import reason_name

#: abort_reason of the round record the epsilon budget leaves (D42).
BUDGET_EXHAUSTED = reason_name(common_pb2.ABORT_REASON_BUDGET_EXHAUSTED)


class RoundOutcomes:
    """See the module doc."""

    def __init__(self, *, store: Store, ledger: PrivacyLedger, events: EventHub, metrics: CoordinatorMetrics,
                 wall_clock: Callable[[], datetime], on_hold: Callable[[], None]) -> None:
        self._store = store
        self._ledger = ledger
        self._events = events
        self._metrics = metrics
        self._wall = wall_clock
        self._on_hold = on_hold
        self.rounds_committed = 0
        self.rounds_aborted = 0
        self.epsilon_spent = 0.0
        self.budget_exhausted = False

    async def load_budget(self, *, paused: bool, model_version: int | None) -> None:
        """The epsilon spent so far (from the store's ledger) and whether the
        budget is exhausted already: when even a round with every device
        counted would exceed it (a restart never resets the budget)."""
        ledger = self._ledger
        self.epsilon_spent = await asyncio.to_thread(ledger.spent)
        if ledger.budget is not None:
            best = await asyncio.to_thread(ledger.epsilon_after, cohort=1, counted=1)
            if best > ledger.budget:
                await self.exhaust_budget(best, paused=paused, model_version=model_version)
        self._metrics.privacy(spent=self.epsilon_spent, budget=ledger.budget, exhausted=self.budget_exhausted)

    async def save_abort(self, r: AnyRound, record: RoundRecord) -> None:
        """Save aborted round `r` (`record`), with its privacy charge when its
        sum may have been learned (`interrupted_charge.abort_charge`, D94) in
        the same transaction; the epsilon spent then includes it."""
        def charge_and_save() -> PrivacyEntry | None:  # one worker-thread hop: price, then write
            entry = abort_charge(self._ledger, r, self._store.privacy_ledger()) if self._ledger.enabled else None
            self._store.abort_round(record, privacy_entry=entry)
            return entry

        entry = await asyncio.to_thread(charge_and_save)
        if entry is not None:
            log_event("round_charged", logging.WARNING, round=r.number, epsilon=f"{entry.epsilon:.4g}",
                      cumulative_epsilon=f"{entry.cumulative_epsilon:.4g}",
                      why="the round aborted after its sum became reconstructable (D94)")
            self.spent(entry)

    async def record_abort_only(self, number: int, reason: int, detail: str, *, base_version: int | None,
                                cohort_size: int = 0) -> None:
        """A round that aborted before it started (number `number`,
        AbortReason `reason`): its record, log line, count and event."""
        now = self._wall()
        rec = RoundRecord(
            number=number, state=RoundState.ABORTED, started_at=now, ended_at=now, cohort_size=cohort_size,
            abort_reason=reason_name(reason), base_model_version=base_version,
        )
        await asyncio.to_thread(self._store.abort_round, rec)
        log_event("round_aborted", logging.WARNING, round=number, reason=reason_name(reason), detail=detail)
        self.rounds_aborted += 1
        self._metrics.round_ended(committed=False, reason=reason_name(reason), duration_s=0.0, timings={}, dropouts={})
        self._events.publish(round_aborted=admin_service_pb2.RoundAbortedEvent(
            round_number=number, reason=common_pb2.AbortReason.ValueType(reason), detail=detail[:500]))

    async def exhaust_budget(self, epsilon_after: float, *, paused: bool, model_version: int | None,
                             cohort_size: int = 0) -> None:
        """The next round could exceed dp.epsilon_budget: hold the loop for
        good, say so (event, metric), and leave one aborted round record
        with reason budget_exhausted (not another one if the latest round
        already says so: a restart does not add records)."""
        budget = self._ledger.budget
        first = not self.budget_exhausted
        self.budget_exhausted = True
        self._on_hold()
        if not first:
            return
        detail = f"epsilon after the next round could reach {epsilon_after:.4g} > budget {budget:g}"
        log_event("budget_exhausted", logging.WARNING, spent=f"{self.epsilon_spent:.4g}", budget=budget,
                  next=f"{epsilon_after:.4g}")
        self._metrics.privacy(spent=self.epsilon_spent, budget=budget, exhausted=True)
        self._events.publish(federation_changed=admin_service_pb2.FederationChanged(
            paused=paused, budget_exhausted=True, model_version=model_version or 0, action="budget"))
        latest = (await asyncio.to_thread(self._store.list_rounds, limit=1)).items
        if latest and latest[0].abort_reason == BUDGET_EXHAUSTED:
            return
        number = await asyncio.to_thread(self._store.next_round_number)
        await self.record_abort_only(number, common_pb2.ABORT_REASON_BUDGET_EXHAUSTED, detail,
                                     base_version=model_version, cohort_size=cohort_size)

    def spent(self, privacy: PrivacyEntry | None) -> None:
        """A round committed with ledger entry `privacy` (None: not accounted)."""
        self._ledger.committed(privacy)
        if privacy is not None:
            self.epsilon_spent = privacy.cumulative_epsilon
            self._metrics.privacy(spent=self.epsilon_spent, budget=self._ledger.budget,
                                  exhausted=self.budget_exhausted)

    def round_over(self, r: AnyRound, *, started_at: datetime, new_version: int | None = None) -> None:
        """Count, measure and announce the end of round `r`."""
        duration = (self._wall() - started_at).total_seconds()
        committed = r.phase is RoundState.COMMITTED
        reason = reason_name(r.abort_reason) if r.abort_reason is not None else None
        self._metrics.round_ended(committed=committed, reason=reason, duration_s=duration, timings=r.timings,
                                  dropouts={k: len(v) for k, v in r.dropouts.items()})
        span = seconds_to_duration(max(0.0, duration))
        if committed:
            self.rounds_committed += 1
            self._events.publish(round_committed=admin_service_pb2.RoundCommittedEvent(
                round_number=r.number, new_model_version=new_version or 0,
                contributors=len(r.result.counted) if r.result is not None else 0, cohort_size=len(r.cohort),
                duration=span, epsilon_spent=self.epsilon_spent))
        else:
            self.rounds_aborted += 1
            self._events.publish(round_aborted=admin_service_pb2.RoundAbortedEvent(
                round_number=r.number, reason=common_pb2.AbortReason.ValueType(r.abort_reason or 0),
                detail=r.abort_detail[:500], duration=span))


__all__ = ["BUDGET_EXHAUSTED", "RoundOutcomes"]
