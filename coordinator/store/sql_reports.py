"""The share-report part of the SQL store (D37): reports and quarantines.

A mixin of `SqlStore` (coordinator/store/sql.py): it runs every method in
one transaction through the store's `_read` / `_write`; the contracts are
those of coordinator/store/interface.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from coordinator.store.orm import QuarantineRow, ShareReportRow
from coordinator.store.report_records import Quarantine, ShareReport

T = TypeVar("T")


class SqlShareReports:
    """Share reports and quarantines on SQL (see the module doc)."""

    if TYPE_CHECKING:  # provided by SqlStore
        def _read(self, body: Callable[[Session], T]) -> T: ...
        def _write(self, body: Callable[[Session], T], *, retry_unique: bool = False) -> T: ...

    def add_share_reports(self, reports: Sequence[ShareReport]) -> None:
        rows = [ShareReportRow(round_number=r.round_number, at=r.at, reporter=r.reporter, reported=r.reported)
                for r in reports]
        if rows:
            self._write(lambda s: s.add_all(rows))

    def list_share_reports(self) -> list[ShareReport]:
        query = select(ShareReportRow).order_by(ShareReportRow.round_number, ShareReportRow.reporter,
                                                ShareReportRow.reported, ShareReportRow.id)
        return self._read(lambda s: [
            ShareReport(round_number=r.round_number, at=r.at, reporter=r.reporter, reported=r.reported)
            for r in s.scalars(query)
        ])

    def forget_share_reports(self, *, before_round: int, before: datetime) -> None:
        stmt = delete(ShareReportRow).where(or_(ShareReportRow.round_number < before_round,
                                                ShareReportRow.at < before))
        self._write(lambda s: s.execute(stmt))

    def add_quarantines(self, quarantines: Sequence[Quarantine]) -> list[Quarantine]:
        def body(s: Session) -> list[Quarantine]:
            rows = [QuarantineRow(device_id=q.device_id, started_round=q.started_round, started_at=q.started_at,
                                  until_round=q.until_round, until=q.until,
                                  charged={"credentials": list(q.charged)}, released_at=q.released_at)
                    for q in quarantines]
            s.add_all(rows)
            s.flush()
            devices = sorted({q.device_id for q in quarantines})
            if devices:
                s.execute(delete(ShareReportRow).where(ShareReportRow.reported.in_(devices)))
            return [_quarantine(r) for r in rows]

        return self._write(body) if quarantines else []

    def list_quarantines(self) -> list[Quarantine]:
        query = select(QuarantineRow).order_by(QuarantineRow.id)
        return self._read(lambda s: [_quarantine(r) for r in s.scalars(query)])

    def release_quarantines(self, ids: Iterable[int], at: datetime) -> None:
        chosen = sorted(set(ids))
        if chosen:
            stmt = (update(QuarantineRow).where(QuarantineRow.id.in_(chosen), QuarantineRow.released_at.is_(None))
                    .values(released_at=at))
            self._write(lambda s: s.execute(stmt))

    def forget_quarantines(self, ids: Iterable[int]) -> None:
        chosen = sorted(set(ids))
        if chosen:
            self._write(lambda s: s.execute(delete(QuarantineRow).where(QuarantineRow.id.in_(chosen))))


def _quarantine(row: QuarantineRow) -> Quarantine:
    return Quarantine(id=row.id, device_id=row.device_id, started_round=row.started_round, started_at=row.started_at,
                      until_round=row.until_round, until=row.until,
                      charged=tuple(row.charged.get("credentials", ())), released_at=row.released_at)
