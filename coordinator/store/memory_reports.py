"""The share-report part of the in-memory store (D37): reports and
quarantines. A mixin of `InMemoryStore`; the contracts are those of
coordinator/store/interface.py. Records are immutable, so lists of them
are copied by `list()`; every method holds the mixin's own lock."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime

from coordinator.store.report_records import Quarantine, ShareReport


class InMemoryShareReports:
    """Share reports and quarantines in process memory."""

    def __init__(self) -> None:
        self._reports_lock = threading.Lock()
        self._share_reports: list[ShareReport] = []
        self._quarantines: dict[int, Quarantine] = {}
        self._last_quarantine_id = 0

    def add_share_reports(self, reports: Sequence[ShareReport]) -> None:
        with self._reports_lock:
            self._share_reports = [*self._share_reports, *reports]

    def list_share_reports(self) -> list[ShareReport]:
        with self._reports_lock:
            return sorted(self._share_reports, key=lambda r: (r.round_number, r.reporter, r.reported))

    def forget_share_reports(self, *, before_round: int, before: datetime) -> None:
        with self._reports_lock:
            self._share_reports = [r for r in self._share_reports
                                   if r.round_number >= before_round and r.at >= before]

    def add_quarantines(self, quarantines: Sequence[Quarantine]) -> list[Quarantine]:
        with self._reports_lock:
            added = []
            for i, q in enumerate(quarantines, start=self._last_quarantine_id + 1):
                added.append(replace(q, id=i))
            devices = {q.device_id for q in quarantines}
            self._quarantines = {**self._quarantines, **{q.id: q for q in added}}
            self._last_quarantine_id += len(added)
            self._share_reports = [r for r in self._share_reports if r.reported not in devices]
            return added

    def list_quarantines(self) -> list[Quarantine]:
        with self._reports_lock:
            return [self._quarantines[i] for i in sorted(self._quarantines)]

    def release_quarantines(self, ids: Iterable[int], at: datetime) -> None:
        with self._reports_lock:
            for i in set(ids):
                q = self._quarantines.get(i)
                if q is not None and q.released_at is None:
                    self._quarantines[i] = replace(q, released_at=at)

    def forget_quarantines(self, ids: Iterable[int]) -> None:
        with self._reports_lock:
            for i in set(ids):
                self._quarantines.pop(i, None)
