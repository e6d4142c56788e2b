"""The Store contract for share reports and quarantines (D37), run against
every backend: memory, sqlite, postgresql (the `backend` fixture)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from coordinator.store import InvalidRecordError, Quarantine, ShareReport

Backend = Any  # the `backend` fixture of conftest.py (conftest modules are not imported by name)

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def report(rnd: int, reporter: str, reported: int, seconds: int = 0) -> ShareReport:
    return ShareReport(round_number=rnd, at=T0 + timedelta(seconds=seconds), reporter=reporter, reported=reported)


def quarantine(device: int, *, charged: tuple[str, ...] = ("a", "b", "c")) -> Quarantine:
    return Quarantine(device_id=device, started_round=3, started_at=T0, until_round=14,
                      until=T0 + timedelta(minutes=10), charged=charged)


def test_share_reports_are_stored_listed_and_forgotten(backend: Backend) -> None:
    s = backend.store
    assert s.list_share_reports() == []
    s.add_share_reports([report(2, "edge-b", 9, 5), report(1, "edge-a", 9), report(1, "edge-a", 7)])
    s.add_share_reports([])
    assert s.list_share_reports() == [report(1, "edge-a", 7), report(1, "edge-a", 9), report(2, "edge-b", 9, 5)]
    s.forget_share_reports(before_round=2, before=T0 - timedelta(days=1))  # round 1 goes
    assert s.list_share_reports() == [report(2, "edge-b", 9, 5)]
    s.forget_share_reports(before_round=0, before=T0 + timedelta(seconds=6))  # too old in time
    assert s.list_share_reports() == []


def test_quarantines_get_ids_forget_reports_and_are_released(backend: Backend) -> None:
    s = backend.store
    s.add_share_reports([report(1, "a", 9), report(2, "b", 9), report(2, "b", 8)])
    first, second = s.add_quarantines([quarantine(9), quarantine(6, charged=())])
    assert 0 < first.id < second.id and first.charged == ("a", "b", "c") and second.charged == ()
    assert s.list_share_reports() == [report(2, "b", 8)]  # the reports about 9 are forgotten
    assert s.list_quarantines() == [first, second]
    assert first.until == T0 + timedelta(minutes=10) and first.until.tzinfo is not None
    s.release_quarantines([first.id, 12345], T0 + timedelta(seconds=3))
    s.release_quarantines([first.id], T0 + timedelta(seconds=99))  # already released: unchanged
    got = s.list_quarantines()
    assert got[0].released_at == T0 + timedelta(seconds=3) and got[1].released_at is None
    s.forget_quarantines([first.id, 12345])
    assert s.list_quarantines() == [second]
    third, = s.add_quarantines([quarantine(9)])
    assert third.id > second.id  # never reused
    assert s.add_quarantines([]) == []


def test_share_records_refuse_nonsense() -> None:
    with pytest.raises(InvalidRecordError):
        ShareReport(round_number=0, at=T0, reporter="a", reported=1)
    with pytest.raises(InvalidRecordError):
        ShareReport(round_number=1, at=T0, reporter="", reported=1)
    with pytest.raises(InvalidRecordError):
        ShareReport(round_number=1, at=T0, reporter="a", reported=2**64 - 1)
    with pytest.raises(InvalidRecordError):
        Quarantine(device_id=1, started_round=3, started_at=T0, until_round=3, until=T0)
    with pytest.raises(InvalidRecordError):
        Quarantine(device_id=1, started_round=3, started_at=T0, until_round=4, until=T0 - timedelta(seconds=1))
