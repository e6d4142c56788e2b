"""Start-up recovery (coordinator/recovery.py): an operator's pause holds
across a restart or a failover to another replica (D90)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from coordinator.recovery import paused_by_operator, recover, stored_pause
from coordinator.store import AuditRecord, InMemoryStore

T0 = datetime(2025, 3, 1, tzinfo=UTC)


def entry(i: int, action: str, outcome: str = "ok") -> AuditRecord:
    return AuditRecord(id=i, at=T0, operator="ops", action=action, outcome=outcome)


def test_the_newest_pause_or_resume_that_changed_the_state_decides() -> None:
    assert paused_by_operator([]) is None
    assert paused_by_operator([entry(3, "rollback"), entry(2, "pause"), entry(1, "resume")]) is True
    assert paused_by_operator([entry(3, "resume", "ok: not paused"), entry(2, "resume"), entry(1, "pause")]) is False
    assert paused_by_operator([entry(2, "pause", "refused: not running"), entry(1, "abort_round")]) is None


def test_a_pause_far_back_in_the_audit_log_is_found_and_unfinished_rounds_are_aborted() -> None:
    store = InMemoryStore()
    assert stored_pause(store) is False
    store.append_audit(operator="ops", action="pause", outcome="ok")
    for _ in range(450):  # more than two pages of other actions since
        store.append_audit(operator="ops", action="abort_round", outcome="refused: no round is collecting")
    assert stored_pause(store) is True
    assert asyncio.run(recover(store)) is True
    store.append_audit(operator="ops", action="resume", outcome="ok")
    assert asyncio.run(recover(store)) is False
