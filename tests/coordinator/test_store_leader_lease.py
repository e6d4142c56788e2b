"""The Store contract for the leader lease and fenced writes (D90), run
against every backend: memory, sqlite, postgresql (the `backend` fixture).
Expiry is the store's clock: the tests use short leases and wait them out."""

from __future__ import annotations

import contextlib
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from coordinator.store import (
    FencedOut,
    InMemoryStore,
    InvalidRecordError,
    Lease,
    NewModelVersion,
    RoundRecord,
    RoundState,
)

Backend = Any  # the `backend` fixture of conftest.py

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def committed(number: int) -> RoundRecord:
    return RoundRecord(number=number, state=RoundState.COMMITTED, started_at=T0, ended_at=T0, cohort_size=3)


def aborted(number: int) -> RoundRecord:
    return RoundRecord(number=number, state=RoundState.ABORTED, started_at=T0, ended_at=T0,
                       cohort_size=3, abort_reason="test")


def version() -> NewModelVersion:
    return NewModelVersion(model_name="m", parameters=b"\x00" * 8)


def test_one_holder_at_a_time_and_takeover_moves_the_token(backend: Backend) -> None:
    s = backend.store
    assert s.current_lease() is None
    a = s.acquire_lease("replica-a", 0.6)
    assert a is not None and a.holder == "replica-a" and a.token >= 1 and a.remaining_s == 0.6
    assert s.acquire_lease("replica-b", 0.6) is None  # a's lease still runs
    renewed = s.acquire_lease("replica-a", 0.6)
    assert renewed is not None and renewed.token == a.token  # a renewal keeps the term
    now = s.current_lease()
    assert now is not None and now.holder == "replica-a" and now.token == a.token and 0 < now.remaining_s <= 0.6
    time.sleep(0.8)  # past the expiry, by any clock
    assert s.current_lease() is None
    b = s.acquire_lease("replica-b", 5.0)
    assert b is not None and b.token == a.token + 1
    assert s.acquire_lease("replica-a", 5.0) is None


def test_a_released_lease_is_free_at_once_and_a_stale_release_does_nothing(backend: Backend) -> None:
    s = backend.store
    a = s.acquire_lease("replica-a", 30.0)
    assert a is not None
    s.release_lease(a)
    b = s.acquire_lease("replica-b", 30.0)
    assert b is not None and b.token == a.token + 1
    s.release_lease(a)  # a's term is over: b keeps the lease
    held = s.current_lease()
    assert held is not None and held.holder == "replica-b" and held.token == b.token


def test_a_deposed_leader_can_neither_commit_nor_abort(backend: Backend) -> None:
    s = backend.store
    a = s.acquire_lease("replica-a", 0.5)
    assert a is not None
    s.commit_round(committed(1), version(), None, fence=a)  # its own term: written
    time.sleep(0.7)
    b = s.acquire_lease("replica-b", 30.0)
    assert b is not None
    with pytest.raises(FencedOut, match="replica-a no longer leads"):
        s.commit_round(committed(2), version(), None, fence=a)
    with pytest.raises(FencedOut):
        s.abort_round(aborted(2), fence=a)
    assert s.get_round(2) is None and [v.round_number for v in s.list_model_versions().items] == [1]
    s.commit_round(committed(2), version(), None, fence=b)
    assert s.get_round(2) is not None and s.get_round(2).state is RoundState.COMMITTED
    s.abort_round(aborted(3))  # unfenced writes (one coordinator, no lease) are unchanged
    assert s.get_round(3) is not None


def test_a_same_named_holder_of_an_older_term_is_fenced_too(backend: Backend) -> None:
    s = backend.store
    old = s.acquire_lease("replica-a", 0.5)
    assert old is not None
    time.sleep(0.7)
    new = s.acquire_lease("replica-a", 30.0)  # expired, then taken again: a new term
    assert new is not None and new.token == old.token + 1
    with pytest.raises(FencedOut):
        s.commit_round(committed(1), version(), None, fence=old)


def test_racing_replicas_get_one_lease(backend: Backend) -> None:
    s = backend.store
    won: list[Lease] = []
    start = threading.Barrier(4)

    def race(name: str) -> None:
        start.wait()
        got = s.acquire_lease(name, 30.0)
        if got is not None:
            won.append(got)

    threads = [threading.Thread(target=race, args=(f"replica-{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and won[0].token == 1


def test_lease_requests_that_no_lease_can_have_are_refused() -> None:
    s = InMemoryStore()
    for holder, seconds in [("", 5.0), ("x" * 256, 5.0), ("a", 0.0), ("a", -1.0), ("a", float("nan")),
                            ("a", 3601.0)]:
        with pytest.raises(InvalidRecordError):
            s.acquire_lease(holder, seconds)
    with pytest.raises(InvalidRecordError):
        Lease("a", 0, 5.0)


def test_a_default_fence_guards_unfenced_writes(backend: Backend) -> None:
    s = backend.store
    a = s.acquire_lease("replica-a", 0.5)
    assert a is not None
    s.fence_writes(lambda: a)
    s.commit_round(committed(1), version(), None)  # fenced with a: its term
    time.sleep(0.7)
    assert s.acquire_lease("replica-b", 30.0) is not None
    with pytest.raises(FencedOut):
        s.commit_round(committed(2), version(), None)
    with pytest.raises(FencedOut):
        s.abort_round(aborted(2))


@pytest.mark.timeout(60)
def test_a_holder_stopped_inside_a_transaction_does_not_block_its_successor(postgresql_url: str) -> None:
    """A replica stopped (SIGSTOP) between two statements of a fenced write keeps
    its session, and with it the lease row's lock. Its successor waits for the
    row at most LOCK_WAIT_S, ends the sessions idle in a transaction on the lease
    table for longer than `stuck_after_s`, and takes the expired lease at its
    next try, instead of waiting for as long as the stopped one sleeps. A lease
    that runs is refused at once, whoever holds its row."""
    from sqlalchemy import text

    from coordinator.store import open_store
    from coordinator.store.sql_lease import LOCK_WAIT_S

    stopped = open_store(postgresql_url)  # no server-side timeout: the successor alone must cope
    successor = open_store(postgresql_url, idle_in_transaction_s=0.5)
    conn = stopped.engine.connect()  # type: ignore[attr-defined]
    try:
        assert stopped.acquire_lease("replica-a", 1.0) is not None
        conn.begin()
        conn.execute(text("SELECT * FROM leader_lease FOR SHARE"))  # as a fenced write begins; then nothing
        began = time.monotonic()
        assert successor.acquire_lease("replica-b", 5.0) is None  # it still runs
        assert time.monotonic() - began < LOCK_WAIT_S  # refused without waiting for the row
        time.sleep(1.1)  # the lease runs out
        got: list[Lease] = []

        def take() -> None:
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline:
                lease = successor.acquire_lease("replica-b", 5.0)
                if lease is not None:
                    got.append(lease)
                    return
                time.sleep(0.2)  # a candidate's poll

        taker = threading.Thread(target=take, daemon=True)
        started = time.monotonic()
        taker.start()
        taker.join(12.0)
        assert got and got[0].holder == "replica-b", "the successor never took the expired lease"
        assert time.monotonic() - started < 2 * LOCK_WAIT_S + 2.0
    finally:
        with contextlib.suppress(Exception):
            conn.close()
        stopped.close()
        successor.close()
