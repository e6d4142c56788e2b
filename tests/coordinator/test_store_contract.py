"""The Store contract, run against every backend: memory, sqlite, postgresql
(the `backend` fixture of conftest.py; PostgreSQL is a real throwaway server).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import event, update

from coordinator.store import (
    COORDINATOR_RESTART,
    ConflictError,
    CorruptBlobError,
    DeviceStatus,
    GroupCharge,
    EnrollmentConflictError,
    InMemoryStore,
    InvalidRecordError,
    NewModelVersion,
    NotFoundError,
    PrivacyEntry,
    RoundRecord,
    RoundState,
    StoreError,
    open_store,
)
from coordinator.store.interface import Store
from coordinator.store.orm import ModelVersionRow
from coordinator.store.sql import SqlStore

if TYPE_CHECKING:  # the fixture's type; conftest modules are not imported by name
    from conftest import Backend

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def progress(number: int, state: RoundState = RoundState.ADVERTISE_KEYS, **kw: Any) -> RoundRecord:
    return RoundRecord(number=number, state=state, started_at=T0 + timedelta(minutes=number), cohort_size=8, **kw)


def committed(number: int, **kw: Any) -> RoundRecord:
    return progress(
        number,
        RoundState.COMMITTED,
        ended_at=T0 + timedelta(minutes=number, seconds=30),
        survivors={"advertise_keys": [1, 2, 3, 4], "masked_input": [1, 2, 4]},
        dropouts={"masked_input": [3]},
        timings={"advertise_keys": 0.25, "unmasking": 1.5},
        metrics={"loss": 0.693, "hr@10": 0.41},
        base_model_version=number,
        **kw,
    )


def model(name: str = "fedrap", blob: bytes = b"params", **hyper: Any) -> NewModelVersion:
    return NewModelVersion(model_name=name, parameters=blob, hyperparameters=hyper or {"lr": 0.05, "k": 16})


def entry(number: int, eps: float = 0.5, cumulative: float | None = None) -> PrivacyEntry:
    return PrivacyEntry(
        round_number=number, epsilon=eps, delta=1e-5, noise_multiplier=1.0, sampling_rate=0.01,
        cumulative_epsilon=eps * number if cumulative is None else cumulative,
    )


# ------------------------------------------------------------------ devices
def test_store_implements_the_protocol(backend: Backend) -> None:
    assert isinstance(backend.store, Store)


def test_enrolment_is_idempotent_per_identity_key(backend: Backend) -> None:
    s = backend.store
    a, new_a = s.enroll_device(b"A" * 32, local_id="user-1", client_id="edge-1")
    b, new_b = s.enroll_device(b"B" * 32, local_id="user-2")
    again, new_again = s.enroll_device(b"A" * 32, local_id="other")
    assert (new_a, new_b, new_again) == (True, True, False)
    assert again == a and a.id != b.id and a.id >= 1
    assert a.status is DeviceStatus.ACTIVE and a.enrolled_at.tzinfo is not None
    assert (a.local_id, a.client_id, a.identity_public_key) == ("user-1", "edge-1", b"A" * 32)
    assert [d.id for d in s.list_devices()] == sorted([a.id, b.id])


def test_devices_are_counted_by_status(backend: Backend) -> None:
    s = backend.store
    assert s.count_devices() == {}
    ids = [s.enroll_device(bytes([i + 1]) * 32)[0].id for i in range(5)]
    s.set_device_status(ids[1], DeviceStatus.REVOKED)
    s.set_device_status(ids[3], DeviceStatus.REVOKED)
    assert s.count_devices() == {DeviceStatus.ACTIVE: 3, DeviceStatus.REVOKED: 2}
    listed = s.list_devices()
    assert s.count_devices() == {st: sum(1 for d in listed if d.status is st) for st in {d.status for d in listed}}


def test_enroll_devices_is_one_batch_in_order(backend: Backend) -> None:
    s = backend.store
    old, _ = s.enroll_device(b"B" * 32, local_id="user-b", client_id="edge-1")
    got = s.enroll_devices([(b"A" * 32, "user-a"), (b"B" * 32, "renamed"), (b"C" * 32, "user-c")], client_id="edge-1")
    assert [(r.identity_public_key, new) for r, new in got] == [(b"A" * 32, True), (b"B" * 32, False), (b"C" * 32, True)]
    assert got[1][0] == old and got[1][0].local_id == "user-b"  # an enrolled key is returned unchanged
    assert [r.local_id for r, _ in got] == ["user-a", "user-b", "user-c"]
    assert all(r.client_id == "edge-1" for r, _ in got)
    again = s.enroll_devices([(b"C" * 32, "user-c"), (b"A" * 32, "user-a")], client_id="edge-1")
    assert [(r, new) for r, new in again] == [(got[2][0], False), (got[0][0], False)]
    assert len(s.list_devices()) == 3 and len({r.id for r, _ in got}) == 3
    assert s.enroll_devices([]) == []


def test_enroll_devices_refuses_the_whole_batch(backend: Backend) -> None:
    s = backend.store
    revoked, _ = s.enroll_device(b"R" * 32, local_id="r")
    s.set_device_status(revoked.id, DeviceStatus.REVOKED)
    theirs, _ = s.enroll_device(b"T" * 32, local_id="t", client_id="edge-2")
    before = s.list_devices()
    with pytest.raises(EnrollmentConflictError) as info:
        s.enroll_devices([(b"N" * 32, "n1"), (b"R" * 32, "r"), (b"M" * 32, "n2")], client_id="edge-1")
    assert (info.value.index, info.value.device_id, info.value.reason) == (1, revoked.id, EnrollmentConflictError.REVOKED)
    with pytest.raises(EnrollmentConflictError) as info:
        s.enroll_devices([(b"N" * 32, "n1"), (b"M" * 32, "n2"), (b"T" * 32, "t")], client_id="edge-1")
    assert (info.value.index, info.value.reason) == (2, EnrollmentConflictError.OTHER_CLIENT)
    with pytest.raises(InvalidRecordError):
        s.enroll_devices([(b"N" * 32, "n1"), (b"N" * 32, "n1-again")])
    with pytest.raises(InvalidRecordError):
        s.enroll_devices([(b"N" * 32, "n1"), (b"", "empty")])
    assert s.list_devices() == before  # nothing of any refused batch was written
    # Without a client id on either side there is no ownership check.
    assert s.enroll_devices([(b"T" * 32, "t")])[0] == (theirs, False)


def test_user_handles_are_unique(backend: Backend) -> None:
    """A non-empty local_id is a user handle: a new device may not take one
    another device holds (the whole batch is refused), re-enrolling the
    holder is fine, and the handle finds the device."""
    s = backend.store
    alice, _ = s.enroll_device(b"A" * 32, local_id="alice", client_id="edge-1")
    before = s.list_devices()
    with pytest.raises(EnrollmentConflictError) as info:
        s.enroll_devices([(b"N" * 32, "new"), (b"M" * 32, "alice")], client_id="edge-2")
    assert (info.value.index, info.value.device_id, info.value.reason) == (
        1, alice.id, EnrollmentConflictError.HANDLE_TAKEN)
    with pytest.raises(InvalidRecordError):
        s.enroll_devices([(b"N" * 32, "twice"), (b"M" * 32, "twice")])
    assert s.list_devices() == before
    assert s.enroll_devices([(b"A" * 32, "alice")], client_id="edge-1")[0] == (alice, False)
    # empty local ids are not handles: any number of devices may have none
    assert [new for _, new in s.enroll_devices([(b"E" * 32, ""), (b"F" * 32, "")])] == [True, True]
    assert s.get_device_by_local_id("alice") == alice
    assert s.get_device_by_local_id("nobody") is None
    assert s.get_device_by_local_id("") is None


def test_audit_log_appends_and_lists_newest_first(backend: Backend) -> None:
    s = backend.store
    assert s.list_audit().items == ()
    first = s.append_audit(operator="ops@example", action="pause", outcome="ok", at=T0)
    second = s.append_audit(operator="ops@example", action="rollback", outcome="ok",
                            details={"version": 3, "new_version": 7, "reason": "bad round"},
                            at=T0 + timedelta(seconds=5))
    third = s.append_audit(operator="bob", action="abort_round", outcome="refused: no round is running")
    assert first.id < second.id < third.id
    assert (second.operator, second.action, second.outcome, dict(second.details), second.at) == (
        "ops@example", "rollback", "ok", {"version": 3, "new_version": 7, "reason": "bad round"}, T0 + timedelta(seconds=5))
    assert third.at.tzinfo is not None
    page = s.list_audit(limit=2)
    assert [e.id for e in page.items] == [third.id, second.id] and page.next_cursor == second.id
    rest = s.list_audit(limit=2, before=page.next_cursor)
    assert rest.items == (first,) and rest.next_cursor is None
    for bad in ({"operator": "", "action": "pause", "outcome": "ok"},
                {"operator": "x" * 129, "action": "pause", "outcome": "ok"},
                {"operator": "a", "action": "", "outcome": "ok"},
                {"operator": "a", "action": "pause", "outcome": ""},
                {"operator": "a", "action": "pause", "outcome": "ok", "details": {"x": float("nan")}},
                {"operator": "a", "action": "pause", "outcome": "ok", "details": {"x": object()}}):
        with pytest.raises(InvalidRecordError):
            s.append_audit(**bad)
    assert len(s.list_audit(limit=10).items) == 3  # the refused appends wrote nothing
    with pytest.raises(InvalidRecordError):
        s.list_audit(limit=0)


def test_enroll_devices_is_all_or_nothing_on_a_failure(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure after the new devices were written (but before the end of
    the transaction) leaves none of them."""
    s = backend.store
    s.enroll_device(b"E" * 32, local_id="existing")
    before = s.list_devices()

    class Injected(RuntimeError):
        pass

    if backend.name == "memory":
        import coordinator.store.memory as memory_module

        made: list[int] = []
        real = memory_module.DeviceRecord

        def second_fails(**kw: Any) -> Any:
            made.append(1)
            if len(made) == 2:
                raise Injected("injected failure at the second new device")
            return real(**kw)

        monkeypatch.setattr(memory_module, "DeviceRecord", second_fails)
    else:
        def after_execute(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
            if statement.lstrip().upper().startswith("INSERT INTO DEVICES"):
                raise Injected("injected failure after the INSERT into devices ran")

        event.listen(backend.engine, "after_cursor_execute", after_execute)

    with pytest.raises((Injected, StoreError)):
        s.enroll_devices([(b"E" * 32, "existing"), (b"N" * 32, "n1"), (b"M" * 32, "n2")])
    if backend.name != "memory":
        event.remove(backend.engine, "after_cursor_execute", after_execute)
    monkeypatch.undo()
    assert s.list_devices() == before
    assert [new for _, new in s.enroll_devices([(b"N" * 32, "n1"), (b"M" * 32, "n2")])] == [True, True]


def test_device_status_and_last_seen(backend: Backend) -> None:
    s = backend.store
    d, _ = s.enroll_device(b"K" * 32)
    seen = datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=timezone(timedelta(hours=2)))
    s.mark_devices_seen([d.id, 999], at=seen)
    got = s.get_device(d.id)
    assert got is not None and got.last_seen_at == seen and got.last_seen_at.tzinfo == UTC
    revoked = s.set_device_status(d.id, DeviceStatus.REVOKED)
    assert revoked.status is DeviceStatus.REVOKED
    assert s.list_devices(status=DeviceStatus.ACTIVE) == []
    assert [x.id for x in s.list_devices(status=DeviceStatus.REVOKED)] == [d.id]
    assert s.get_device(12345) is None
    with pytest.raises(NotFoundError):
        s.set_device_status(12345, DeviceStatus.ACTIVE)


# ----------------------------------------------------------- model versions
def test_model_versions_latest_get_and_list(backend: Backend) -> None:
    s = backend.store
    assert s.latest_model_version() is None
    v1 = s.add_model_version(model("fedrap", b"one"))
    v2 = s.add_model_version(model("fedmf", b"two-two"))
    assert v1.round_number is None and v2.id > v1.id and v2.size_bytes == 7
    latest = s.latest_model_version()
    assert latest is not None and latest.id == v2.id and latest.parameters == b"two-two"
    by_name = s.latest_model_version("fedrap")
    assert by_name is not None and by_name.parameters == b"one" and by_name.hyperparameters == {"lr": 0.05, "k": 16}
    assert s.latest_model_version("pfedrec") is None
    assert s.get_model_version(v1.id).sha256 == v1.sha256
    with pytest.raises(NotFoundError):
        s.get_model_version(10_000)
    for i in range(3):
        s.add_model_version(model(blob=bytes([i])))
    first = s.list_model_versions(limit=2)
    assert len(first.items) == 2 and first.items[0].id > first.items[1].id and first.next_cursor is not None
    rest = s.list_model_versions(limit=10, before=first.next_cursor)
    assert rest.next_cursor is None
    assert [v.id for v in first.items + rest.items] == sorted((v.id for v in first.items + rest.items), reverse=True)
    assert len(first.items + rest.items) == 5
    assert rest.items[-1].id == v1.id and rest.items[-1].size_bytes == 3  # sizes without loading blobs
    with pytest.raises(InvalidRecordError):
        s.list_model_versions(limit=0)


def _corrupt_latest_blob(backend: Backend, version_id: int) -> None:
    if backend.name == "memory":
        assert isinstance(backend.store, InMemoryStore)
        state = backend.store._state  # test-only access to the private state
        state.models[version_id] = dataclasses.replace(state.models[version_id], parameters=b"tampered")
        return
    with backend.engine.begin() as conn:
        conn.execute(update(ModelVersionRow).where(ModelVersionRow.id == version_id).values(parameters=b"tampered"))


def test_a_corrupted_blob_raises(backend: Backend) -> None:
    s = backend.store
    v = s.add_model_version(model(blob=b"good parameters"))
    assert s.latest_model_version() is not None
    _corrupt_latest_blob(backend, v.id)
    with pytest.raises(CorruptBlobError) as info:
        s.latest_model_version()
    assert info.value.version_id == v.id
    with pytest.raises(CorruptBlobError):
        s.get_model_version(v.id)
    # Listing does not read blobs, so the admin can still show the history.
    assert s.list_model_versions().items[0].id == v.id


# ------------------------------------------------------------------- rounds
def test_round_progress_commit_and_reads(backend: Backend) -> None:
    s = backend.store
    assert s.next_round_number() == 1
    s.save_round_progress(progress(1, RoundState.SELECTING))
    s.save_round_progress(progress(1, RoundState.SHARE_KEYS, survivors={"advertise_keys": [1, 2]}))
    got = s.get_round(1)
    assert got is not None and got.state is RoundState.SHARE_KEYS and got.survivors == {"advertise_keys": [1, 2]}
    assert s.next_round_number() == 2

    version = s.commit_round(committed(1), model(blob=b"v1"), entry(1))
    assert version.round_number == 1
    final = s.get_round(1)
    assert final == committed(1)
    assert final is not None and final.started_at.tzinfo == UTC
    latest = s.latest_model_version()
    assert latest is not None and latest.id == version.id and latest.round_number == 1
    assert s.privacy_ledger() == [entry(1)]


def test_a_round_in_groups_keeps_its_groups_in_the_ledger(backend: Backend) -> None:
    """D99: the entry of a round in groups lists each released group (size,
    counted, the multiplier its sum carried), and reads back as written."""
    s = backend.store
    s.save_round_progress(progress(1, RoundState.SHARE_KEYS))
    groups = (GroupCharge(size=5, counted=4, noise_multiplier=0.894), GroupCharge(size=6, counted=6,
                                                                                    noise_multiplier=1.0))
    grouped = PrivacyEntry(round_number=1, epsilon=0.7, delta=1e-5, noise_multiplier=0.894, sampling_rate=1.0,
                           cumulative_epsilon=0.7, groups=groups)
    s.commit_round(committed(1), model(blob=b"v1"), grouped)
    assert s.privacy_ledger() == [grouped] and s.privacy_ledger()[0].groups == groups


def test_a_group_below_its_rounds_multiplier_is_refused() -> None:
    """No group's sum may carry less noise than the round is accounted at:
    that entry would under-report."""
    with pytest.raises(InvalidRecordError, match="less noise"):
        PrivacyEntry(round_number=1, epsilon=0.7, delta=1e-5, noise_multiplier=1.0, sampling_rate=1.0,
                     cumulative_epsilon=0.7, groups=(GroupCharge(size=5, counted=4, noise_multiplier=0.9),))
    with pytest.raises(InvalidRecordError, match="0..size"):
        GroupCharge(size=5, counted=6, noise_multiplier=1.0)


def test_next_round_number_never_hands_out_a_number_twice(backend: Backend) -> None:
    s = backend.store
    assert [s.next_round_number() for _ in range(3)] == [1, 2, 3]  # allocated, even if never written
    s.save_round_progress(progress(3))
    assert s.next_round_number() == 4
    s.save_round_progress(progress(9))  # a number written without allocation moves the counter on
    assert s.next_round_number() == 10
    if backend.url is not None:  # the counter is in the database: a restart continues it
        s.close()
        s = backend.store = open_store(backend.url)
        assert s.next_round_number() == 11


def test_terminal_rounds_are_never_rewritten(backend: Backend) -> None:
    s = backend.store
    s.commit_round(committed(1), model(), entry(1))
    with pytest.raises(ConflictError):
        s.save_round_progress(progress(1))
    with pytest.raises(ConflictError):
        s.commit_round(committed(1), model(), None)
    with pytest.raises(ConflictError):
        s.abort_round(progress(1, RoundState.ABORTED, abort_reason="cancelled"))
    assert len(s.list_model_versions().items) == 1 and len(s.privacy_ledger()) == 1


def test_wrong_states_and_mismatched_entries_are_rejected(backend: Backend) -> None:
    s = backend.store
    with pytest.raises(InvalidRecordError):
        s.save_round_progress(committed(1))
    with pytest.raises(InvalidRecordError):
        s.commit_round(progress(1), model(), None)
    with pytest.raises(InvalidRecordError):
        s.commit_round(committed(1), model(), entry(2))
    with pytest.raises(InvalidRecordError):
        s.abort_round(committed(1))
    with pytest.raises(InvalidRecordError):
        progress(2, RoundState.ABORTED)  # an abort needs a reason
    with pytest.raises(InvalidRecordError):
        RoundRecord(number=3, state=RoundState.SELECTING, started_at=datetime(2025, 1, 1), cohort_size=1)
    assert s.get_round(1) is None and s.latest_model_version() is None


def test_abort_round_and_commit_without_privacy_entry(backend: Backend) -> None:
    s = backend.store
    s.save_round_progress(progress(1))
    s.abort_round(progress(1, RoundState.ABORTED, abort_reason="too_few_survivors", ended_at=T0))
    s.commit_round(committed(2), model(), None)
    r1, r2 = s.get_round(1), s.get_round(2)
    assert r1 is not None and r1.state is RoundState.ABORTED and r1.abort_reason == "too_few_survivors"
    assert r2 is not None and r2.state is RoundState.COMMITTED
    assert s.privacy_ledger() == []


@pytest.mark.parametrize("fail_at", ["model_versions", "privacy_ledger"])
def test_commit_round_is_all_or_nothing(backend: Backend, monkeypatch: pytest.MonkeyPatch, fail_at: str) -> None:
    """A failure in the middle of commit_round (after the round row was
    updated) leaves the store exactly as before the call."""
    s = backend.store
    s.add_model_version(model(blob=b"initial"))
    s.save_round_progress(progress(1, RoundState.UNMASKING))
    before = (s.get_round(1), s.list_model_versions().items, s.privacy_ledger())

    class Injected(RuntimeError):
        pass

    if backend.name == "memory":
        target = "_new_model" if fail_at == "model_versions" else "_insert_privacy_entry"

        def boom(*_: Any, **__: Any) -> None:
            raise Injected(f"injected failure writing {fail_at}")

        monkeypatch.setattr(InMemoryStore, target, boom)
    else:
        # Fail inside the database transaction, when the driver is about to
        # execute the INSERT into `fail_at` (the round UPDATE already ran).
        def on_execute(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
            if statement.lstrip().upper().startswith(f"INSERT INTO {fail_at.upper()}"):
                raise Injected(f"injected failure: {statement.split('(')[0]}")

        event.listen(backend.engine, "before_cursor_execute", on_execute)

    with pytest.raises((Injected, StoreError)):
        s.commit_round(committed(1), model(blob=b"new"), entry(1))

    if backend.name != "memory":
        event.remove(backend.engine, "before_cursor_execute", on_execute)
    monkeypatch.undo()
    assert (s.get_round(1), s.list_model_versions().items, s.privacy_ledger()) == before
    # And the store still works: the same commit now succeeds.
    s.commit_round(committed(1), model(blob=b"new"), entry(1))
    assert s.latest_model_version() is not None and s.get_round(1) == committed(1)


def test_interrupted_rounds_are_marked_aborted(backend: Backend) -> None:
    s = backend.store
    s.commit_round(committed(1), model(), None)
    s.abort_round(progress(2, RoundState.ABORTED, abort_reason="cancelled", ended_at=T0))
    s.save_round_progress(progress(3, RoundState.MASKED_INPUT))
    s.save_round_progress(progress(4, RoundState.SELECTING))
    if backend.url is not None:  # a real restart: a new process opens the same database
        s.close()
        s = backend.store = open_store(backend.url)
    at = T0 + timedelta(hours=1)
    assert s.mark_interrupted_rounds_aborted(at=at) == [3, 4]
    for n in (3, 4):
        r = s.get_round(n)
        assert r is not None and r.state is RoundState.ABORTED
        assert r.abort_reason == COORDINATOR_RESTART and r.ended_at == at
    first, second = s.get_round(1), s.get_round(2)
    assert first is not None and first.state is RoundState.COMMITTED
    assert second is not None and second.abort_reason == "cancelled"
    assert s.mark_interrupted_rounds_aborted() == []


def test_rounds_page_newest_first(backend: Backend) -> None:
    s = backend.store
    for n in range(1, 6):
        s.save_round_progress(progress(n))
    page = s.list_rounds(limit=2)
    assert [r.number for r in page.items] == [5, 4] and page.next_cursor == 4
    page = s.list_rounds(limit=2, before=page.next_cursor)
    assert [r.number for r in page.items] == [3, 2] and page.next_cursor == 2
    page = s.list_rounds(limit=2, before=page.next_cursor)
    assert [r.number for r in page.items] == [1] and page.next_cursor is None


def test_privacy_budget_summary(backend: Backend) -> None:
    s = backend.store
    empty = s.privacy_summary()
    assert (empty.rounds_accounted, empty.cumulative_epsilon, empty.delta) == (0, 0.0, None)
    for n in (1, 2, 3):
        s.commit_round(committed(n), model(blob=bytes([n])), entry(n, eps=0.25, cumulative=0.2 + 0.2 * n))
    summary = s.privacy_summary()
    assert summary.rounds_accounted == 3 and summary.last_round == 3
    assert summary.cumulative_epsilon == pytest.approx(0.8)
    assert summary.epsilon_sum == pytest.approx(0.75) and summary.delta == 1e-5
    assert [e.round_number for e in s.privacy_ledger()] == [1, 2, 3]


def test_returned_records_are_copies(backend: Backend) -> None:
    s = backend.store
    s.save_round_progress(progress(1, survivors={"advertise_keys": [1]}))
    r = s.get_round(1)
    assert r is not None
    survivors = r.survivors["advertise_keys"]
    assert isinstance(survivors, list)  # a plain list, so mutating it is possible
    survivors.append(99)
    again = s.get_round(1)
    assert again is not None and again.survivors == {"advertise_keys": [1]}


def test_clock_is_injected() -> None:
    fixed = datetime(2030, 1, 1, tzinfo=UTC)
    clock: Callable[[], datetime] = lambda: fixed  # noqa: E731
    s = InMemoryStore(clock=clock)
    d, _ = s.enroll_device(b"x" * 32)
    assert d.enrolled_at == fixed
    assert s.add_model_version(model()).created_at == fixed


def test_sql_store_is_returned_for_sql_urls(backend: Backend) -> None:
    assert isinstance(backend.store, InMemoryStore if backend.name == "memory" else SqlStore)
