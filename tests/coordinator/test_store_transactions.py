"""Transaction modes and retries of the SQL store (decision D21):
the retry helper (pure), the error classification, SQLite's BEGIN modes
and waiting writers, and PostgreSQL retries of real serialization failures
and deadlocks."""

from __future__ import annotations

import logging
import random
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import OperationalError

from coordinator.store import StoreError, open_store
from coordinator.store.retry import RetryPolicy, run_with_retries
from coordinator.store.sql import SqlStore
from coordinator.store.transactions import TxKind, execution_options, is_transient, is_unique_violation


# ------------------------------------------------------------------ retry helper
class Flaky:
    def __init__(self, failures: list[BaseException], result: str = "ok") -> None:
        self.failures = list(failures)
        self.calls = 0
        self.result = result

    def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return self.result


class Transient(Exception):
    pass


def test_retries_until_success_with_bounded_jittered_waits() -> None:
    waits: list[float] = []
    fn = Flaky([Transient(), Transient(), Transient()])
    policy = RetryPolicy(attempts=5, base_delay=0.01, max_delay=0.025)
    seen: list[int] = []
    assert run_with_retries(fn, retryable=lambda e: isinstance(e, Transient), policy=policy, sleep=waits.append,
                            rng=random.Random(0), on_retry=lambda n, _e: seen.append(n)) == "ok"
    assert fn.calls == 4 and seen == [1, 2, 3] and len(waits) == 3
    caps = [0.01, 0.02, 0.025]  # base * 2**(k-1), capped at max_delay
    assert all(0.0 <= w <= cap for w, cap in zip(waits, caps, strict=True))
    assert len(set(waits)) == 3  # jittered, not a fixed schedule


def test_gives_up_after_the_last_attempt_and_never_retries_other_errors() -> None:
    fn = Flaky([Transient(f"#{i}") for i in range(10)])
    with pytest.raises(Transient, match="#2"):
        run_with_retries(fn, retryable=lambda e: isinstance(e, Transient), policy=RetryPolicy(attempts=3),
                         sleep=lambda _s: None)
    assert fn.calls == 3
    other = Flaky([ValueError("not transient"), Transient()])
    with pytest.raises(ValueError):
        run_with_retries(other, retryable=lambda e: isinstance(e, Transient), sleep=lambda _s: None)
    assert other.calls == 1


def test_jitter_spreads_over_the_whole_window() -> None:
    policy = RetryPolicy(attempts=10, base_delay=0.1, max_delay=10.0)
    rng = random.Random(1)
    draws = [policy.delay(3, rng) for _ in range(2000)]
    assert 0.0 <= min(draws) < 0.02 and 0.38 < max(draws) <= 0.4  # uniform on [0, 0.1 * 2**2]


@pytest.mark.parametrize("kw", [{"attempts": 0}, {"base_delay": -1.0}, {"max_delay": -0.5}])
def test_bad_policies_are_refused(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kw)
    with pytest.raises(ValueError):
        RetryPolicy().delay(0, random.Random())


# --------------------------------------------------------------- classification
class FakeDriverError(Exception):
    def __init__(self, sqlstate: str | None = None, sqlite_errorcode: int | None = None) -> None:
        super().__init__("fake")
        self.sqlstate = sqlstate
        self.sqlite_errorcode = sqlite_errorcode


@pytest.mark.parametrize(
    ("orig", "transient", "unique"),
    [
        (FakeDriverError("40001"), True, False),  # serialization_failure
        (FakeDriverError("40P01"), True, False),  # deadlock_detected
        (FakeDriverError("23505"), False, True),  # unique_violation
        (FakeDriverError("23503"), False, False),  # foreign_key_violation
        (FakeDriverError("08006"), False, False),  # connection_failure: outcome unknown, never retried
        (FakeDriverError(sqlite_errorcode=sqlite3.SQLITE_BUSY), False, False),
        (FakeDriverError(sqlite_errorcode=2067), False, True),  # SQLITE_CONSTRAINT_UNIQUE
    ],
)
def test_errors_are_classified_by_sqlstate(orig: FakeDriverError, transient: bool, unique: bool) -> None:
    wrapped = OperationalError("stmt", {}, orig)
    assert (is_transient(wrapped), is_unique_violation(wrapped)) == (transient, unique)
    assert is_transient(orig) == transient


def test_execution_options_per_backend_and_kind() -> None:
    assert execution_options("sqlite", TxKind.READ) == {"fedmask_sqlite_begin": "DEFERRED"}
    assert execution_options("sqlite", TxKind.WRITE) == {"fedmask_sqlite_begin": "IMMEDIATE"}
    assert execution_options("postgresql", TxKind.WRITE) == {"isolation_level": "READ COMMITTED",
                                                             "postgresql_readonly": False}
    assert execution_options("postgresql", TxKind.READ)["postgresql_readonly"] is True
    with pytest.raises(ValueError):
        execution_options("mysql", TxKind.READ)


# ---------------------------------------------------------------------- SQLite
def _sqlite_store(tmp_path: Path) -> SqlStore:
    store = open_store(f"sqlite:///{tmp_path / 'f.db'}")
    assert isinstance(store, SqlStore)
    return store


def test_sqlite_writes_begin_immediate_and_reads_deferred(tmp_path: Path) -> None:
    store = _sqlite_store(tmp_path)
    begins: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.startswith("BEGIN"):
            begins.append(statement)

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        d, _ = store.enroll_device(b"k" * 32)
        store.next_round_number()
        assert begins == ["BEGIN IMMEDIATE", "BEGIN IMMEDIATE"]
        begins.clear()
        store.get_device(d.id)
        store.list_rounds()
        store.latest_model_version()
        assert begins == ["BEGIN DEFERRED"] * 3
        begins.clear()
        with store.engine.begin() as conn:  # a plain engine transaction (migrations, tools) may write
            conn.execute(text("SELECT 1"))
        assert begins == ["BEGIN IMMEDIATE"]
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
        store.close()


def test_sqlite_writer_waits_for_another_process_writer(tmp_path: Path) -> None:
    """Another connection (another process, for SQLite) holds the write
    lock for a while: the store's write waits and succeeds instead of
    failing with "database is locked"."""
    store = _sqlite_store(tmp_path)
    store.enroll_device(b"first" + b"\0" * 27)  # a read-then-write history on this connection
    other = sqlite3.connect(tmp_path / "f.db", isolation_level=None, timeout=10, check_same_thread=False)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("UPDATE devices SET local_id = 'held'")
        release = threading.Timer(0.4, other.execute, args=("COMMIT",))
        release.start()
        t0 = time.monotonic()
        d, new = store.enroll_device(b"second" + b"\0" * 26)
        waited = time.monotonic() - t0
        release.join()
        assert new and waited >= 0.3
        assert [x.local_id for x in store.list_devices()] == ["held", ""]
    finally:
        other.close()
        store.close()


# ------------------------------------------------------------------ PostgreSQL
class Injector:
    """Makes the next `times` statements starting with `prefix` fail on the
    server with `sqlstate` (a real psycopg error raised inside the store's
    transaction); `count` says how many were injected."""

    def __init__(self, store: SqlStore, prefix: str, sqlstate: str, times: int) -> None:
        self.store, self.prefix, self.sqlstate, self.times, self.count = store, prefix, sqlstate, times, 0
        event.listen(store.engine, "before_cursor_execute", self._before)

    def _before(self, conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith(self.prefix) and self.count < self.times:
            self.count += 1
            cursor.execute(f"DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '{self.sqlstate}'; END $$")

    def remove(self) -> None:
        event.remove(self.store.engine, "before_cursor_execute", self._before)


@pytest.fixture
def pg_store(postgresql_url: str) -> Any:
    store = open_store(postgresql_url)
    assert isinstance(store, SqlStore)
    try:
        yield store
    finally:
        store.close()


@pytest.mark.parametrize("sqlstate", ["40001", "40P01"])
def test_postgresql_retries_a_transaction_rolled_back_by_a_concurrent_one(pg_store: SqlStore, sqlstate: str) -> None:
    injector = Injector(pg_store, "INSERT INTO DEVICES", sqlstate, times=2)
    d, new = pg_store.enroll_device(b"p" * 32, local_id="p")
    assert injector.count == 2 and new  # two rolled-back attempts, then the third commits
    assert [x.id for x in pg_store.list_devices()] == [d.id]  # exactly one row


def test_postgresql_gives_up_after_the_policy_and_never_retries_other_errors(postgresql_url: str) -> None:
    opened = open_store(postgresql_url)
    assert isinstance(opened, SqlStore)
    store = SqlStore(opened.engine, retry=RetryPolicy(attempts=3, base_delay=0.0))
    try:
        injector = Injector(store, "INSERT INTO DEVICES", "40001", times=100)
        with pytest.raises(StoreError) as info:
            store.enroll_device(b"q" * 32)
        assert injector.count == 3 and info.value.__cause__ is not None and is_transient(info.value.__cause__)
        injector.remove()
        injector = Injector(store, "INSERT INTO DEVICES", "22012", times=100)  # division_by_zero
        with pytest.raises(StoreError):
            store.enroll_device(b"q" * 32)
        assert injector.count == 1
        injector.remove()
        assert store.list_devices() == []
    finally:
        store.close()


def test_postgresql_real_deadlock_is_retried(pg_store: SqlStore, postgresql_url: str,
                                             caplog: pytest.LogCaptureFixture) -> None:
    """A foreign transaction holds new key b and then inserts new key a,
    while the store's batch holds a and waits for b: a real deadlock.
    PostgreSQL rolls the store's attempt back (its deadlock_timeout is the
    shorter), the store retries it, and the batch ends with both devices
    enrolled once (by the foreign transaction, which committed first)."""
    import psycopg

    a, b = b"a" * 32, b"b" * 32
    # (distinct local ids: a non-empty local_id is a unique user handle, migration 0003)
    insert = "INSERT INTO devices (identity_public_key, local_id, enrolled_at, status) VALUES (%s, %s, now(), 'active')"
    caplog.set_level(logging.INFO, logger="fedmask.coordinator.store")
    results: list[list[tuple[int, bool]]] = []
    errors: list[BaseException] = []

    def store_side() -> None:
        try:  # inserts in key order: a (free), then b (held by the foreign transaction)
            results.append([(r.id, new) for r, new in pg_store.enroll_devices([(b, "b"), (a, "a")])])
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    with psycopg.connect(postgresql_url.replace("postgresql+psycopg://", "postgresql://")) as foreign:
        foreign.execute("SET deadlock_timeout = '20s'")  # the store's side (1 s) detects the cycle
        foreign.execute(insert, (b, "f-b"))
        t = threading.Thread(target=store_side)
        t.start()
        time.sleep(0.5)  # the store's attempt holds a and waits for b
        foreign.execute(insert, (a, "f-a"))  # waits for a until PostgreSQL rolls the store's attempt back
        foreign.commit()
        t.join(30)
    assert errors == [] and not t.is_alive()
    assert [new for _, new in results[0]] == [False, False]
    assert "deadlock detected" in caplog.text
    assert sorted(bytes(d.identity_public_key) for d in pg_store.list_devices()) == [a, b]
