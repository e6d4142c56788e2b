"""The coordinator's side of the share-report rule (D37): it applies the
pure rule of coordinator/peer_reports.py to the state in the store.

    ledger = ReportLedger(store, policy, wall_clock=..., credential_of=...)
    await ledger.record(round_number, reports, survivors=...)  # after a round
    await ledger.refresh(next_round)                             # before selection
    ledger.excluded(eligible, minimum)                           # sync, cached

Every store call runs on a worker thread. `excluded` works on the
quarantines cached by the last `refresh`/`record` (selection calls it in a
loop); a release it decides is logged at once and written to the store by
the next `refresh`. Since reports and quarantines live in the store, every
replica of the coordinator sees the same ones after its next refresh.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime

from coordinator.logs import log_event
from coordinator.peer_reports import (
    ReportPolicy,
    countable_reports,
    decide_quarantines,
    forgettable,
    in_force,
    releases_for_minimum,
    report_window,
)
from coordinator.store import Store
from coordinator.store.report_records import Quarantine, ShareReport


class ReportLedger:
    """Share reports and quarantines, persisted in the store (see the module doc)."""

    def __init__(self, store: Store, policy: ReportPolicy, *, wall_clock: Callable[[], datetime],
                 credential_of: Callable[[int], str]) -> None:
        self.store = store
        self.policy = policy
        self._wall = wall_clock
        self._credential_of = credential_of
        self._active: list[Quarantine] = []
        self._next_round = 1
        self._to_release: dict[int, Quarantine] = {}

    async def record(self, round_number: int, reports: Mapping[int, Iterable[int]], *,
                     survivors: Iterable[int]) -> list[Quarantine]:
        """Take one round's share-check reports ({reporter: reported}) and
        the devices the share check kept; returns the quarantines this
        round started (and logs the round's reports and what counted)."""
        now = self._wall()
        counted = countable_reports(round_number, now, reports, survivors=survivors,
                                    credential_of=self._credential_of)
        try:
            started = await asyncio.to_thread(self._record, round_number, now, counted)
        except Exception as exc:  # a store outage must not end the round loop: the round is over anyway
            log_event("share_reports_not_stored", logging.ERROR, round=round_number,
                      error=f"{type(exc).__name__}: {exc}")
            started = []
        log_event("share_reports", logging.WARNING, round=round_number,
                  reports=";".join(f"{k}:{','.join(map(str, v))}" for k, v in sorted(reports.items())),
                  counted=";".join(f"{r.reporter}:{r.reported}" for r in counted),
                  quarantined=",".join(str(q.device_id) for q in started))
        return started

    def _record(self, round_number: int, now: datetime, counted: list[ShareReport]) -> list[Quarantine]:
        s = self.store
        s.add_share_reports(counted)
        oldest_round, oldest_at = report_window(self.policy, round_number, now)
        s.forget_share_reports(before_round=oldest_round, before=oldest_at)
        decision = decide_quarantines(self.policy, s.list_share_reports(), s.list_quarantines(), round_number, now)
        for r in decision.refused:  # the bound of D37 at work: a coalition spent its quota
            log_event("quarantine_refused", logging.WARNING, round=round_number, device=r.device_id,
                      reporters=",".join(r.reporters), with_quota=",".join(r.with_quota),
                      why=f"fewer than {self.policy.reporters} reporting credentials have quota left "
                          f"({self.policy.quota} quarantines per {self.policy.window_s:g} s each)")
        started = s.add_quarantines(decision.started)
        self._load(round_number + 1, now)
        return started

    async def refresh(self, next_round: int) -> None:
        """Write pending releases, forget stale quarantines and reload the
        ones in force for round `next_round`."""
        await asyncio.to_thread(self._refresh, next_round, self._wall())

    def _refresh(self, next_round: int, now: datetime) -> None:
        pending, self._to_release = self._to_release, {}
        if pending:
            self.store.release_quarantines(pending, now)
        self._load(next_round, now)

    def _load(self, next_round: int, now: datetime) -> None:
        stored = self.store.list_quarantines()
        stale = forgettable(self.policy, stored, next_round - 1, now)
        if stale:
            self.store.forget_quarantines(stale)
        self._next_round = next_round
        self._active = in_force(stored, next_round, now)

    def excluded(self, eligible: Iterable[int], minimum: int) -> frozenset[int]:
        """The devices quarantine keeps out of the next selection, given the
        devices otherwise `eligible`: never so many that fewer than
        `minimum` remain (the earliest-expiring are released first, logged
        as `quarantine_released`)."""
        now = self._wall()
        active = [q for q in in_force(self._active, self._next_round, now) if q.id not in self._to_release]
        released = releases_for_minimum(active, eligible, minimum)
        if released:
            for q in released:
                self._to_release[q.id] = q
            log_event("quarantine_released", logging.WARNING, devices=",".join(str(q.device_id) for q in released),
                      why=f"fewer than the cohort minimum {minimum} eligible otherwise")
            active = [q for q in active if q.id not in self._to_release]
        return frozenset(q.device_id for q in active)

    def quarantined(self) -> frozenset[int]:
        """The devices in quarantine as last loaded (for tests and status)."""
        now = self._wall()
        return frozenset(q.device_id for q in in_force(self._active, self._next_round, now)
                         if q.id not in self._to_release)
