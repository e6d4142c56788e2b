"""The store under concurrency, on every backend.

Several threads enrol batches of devices (overlapping keys between threads,
and batches that must be refused as a whole) while two threads run the
round-writing sequence of the coordinator (next_round_number,
save_round_progress, commit_round with a model version and a privacy entry,
or abort_round). On SQL backends each thread opens its own store on the
same database, as separate processes would, so SQLite's write lock and
PostgreSQL's row locks are what keeps them apart.

Asserted: zero unexpected errors, no partial enrolment, every key enrolled
exactly once, unique round numbers, every committed round present with its
exact model blob and privacy entry.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from coordinator.store import (
    DeviceStatus,
    EnrollmentConflictError,
    NewModelVersion,
    PrivacyEntry,
    RoundRecord,
    RoundState,
    Store,
    open_store,
)


T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
ENROLLERS = 4
BATCHES = 8
BATCH = 16
ROUND_WRITERS = 2
ROUNDS_EACH = 10


def key(n: int) -> bytes:
    return hashlib.sha256(b"device-%d" % n).digest()


def blob_of(number: int) -> bytes:
    """The exact parameters committed by round `number`."""
    return hashlib.sha256(b"aggregate-%d" % number).digest() * 4


def round_record(number: int, state: RoundState, *, abort_reason: str | None = None,
                 survivors: dict[str, list[int]] | None = None, metrics: dict[str, float] | None = None) -> RoundRecord:
    ended = T0 + timedelta(minutes=number, seconds=30) if state.is_terminal else None
    return RoundRecord(number=number, state=state, started_at=T0 + timedelta(minutes=number), cohort_size=4,
                       ended_at=ended, abort_reason=abort_reason, survivors=survivors or {}, metrics=metrics or {})


def run_threads(targets: list[Callable[[], None]]) -> list[BaseException]:
    errors: list[BaseException] = []
    start = threading.Barrier(len(targets))

    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                start.wait()
                fn()
            except BaseException as exc:  # noqa: BLE001 - collected and asserted on
                errors.append(exc)

        return run

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a thread is stuck"
    return errors


@pytest.mark.timeout(60)
def test_parallel_enrolment_with_live_rounds(backend: Any) -> None:
    main = backend.store
    revoked, _ = main.enroll_device(b"R" * 32, local_id="revoked")
    main.set_device_status(revoked.id, DeviceStatus.REVOKED)
    stores: list[Store] = []

    def own_store() -> Store:
        """A store of its own on the same database (like another process)."""
        if backend.url is None:
            return main
        s = open_store(backend.url, migrate=False)
        stores.append(s)
        return s

    results: dict[tuple[int, int], list[tuple[int, bytes, bool]]] = {}
    refused: list[list[bytes]] = []
    committed: dict[int, int] = {}  # round number -> model version id
    aborted: list[int] = []
    lock = threading.Lock()

    def enroller(t: int) -> Callable[[], None]:
        s = own_store()

        def run() -> None:
            for b in range(BATCHES):
                # Threads t and t+1 overlap by half a batch: the same new keys race.
                first = (t * BATCHES + b) * BATCH // 2
                batch = [(key(n), f"user-{n}") for n in range(first, first + BATCH)]
                got = s.enroll_devices(batch, client_id=None)
                with lock:
                    results[(t, b)] = [(r.id, r.identity_public_key, new) for r, new in got]
                if b % 3 == 2:  # a batch with a revoked device: refused whole, nothing written
                    fresh = [(key(10_000 + 100 * t + b + i), f"x-{t}-{b}-{i}") for i in range(4)]
                    try:
                        s.enroll_devices([*fresh[:2], (b"R" * 32, "revoked"), *fresh[2:]])
                    except EnrollmentConflictError as exc:
                        assert exc.index == 2 and exc.reason == exc.REVOKED
                        with lock:
                            refused.append([k for k, _ in fresh])
                    else:
                        raise AssertionError("a batch with a revoked device was accepted")

        return run

    def round_writer(w: int) -> Callable[[], None]:
        s = own_store()

        def run() -> None:
            for i in range(ROUNDS_EACH):
                n = s.next_round_number()
                s.save_round_progress(round_record(n, RoundState.SELECTING))
                s.save_round_progress(round_record(n, RoundState.MASKED_INPUT, survivors={"selected": [1, 2, 3]}))
                if (i + w) % 4 == 3:
                    s.abort_round(round_record(n, RoundState.ABORTED, abort_reason="too_few_survivors"))
                    with lock:
                        aborted.append(n)
                    continue
                entry = PrivacyEntry(round_number=n, epsilon=0.1, delta=1e-5, noise_multiplier=1.0,
                                     sampling_rate=0.01, cumulative_epsilon=0.1 * n)
                summary = s.commit_round(
                    round_record(n, RoundState.COMMITTED, metrics={"writer": float(w)}),
                    NewModelVersion(model_name="synthetic", parameters=blob_of(n), hyperparameters={"round": n}),
                    entry,
                )
                with lock:
                    committed[n] = summary.id

        return run

    try:
        errors = run_threads([enroller(t) for t in range(ENROLLERS)] + [round_writer(w) for w in range(ROUND_WRITERS)])
    finally:
        for s in stores:
            s.close()
    assert errors == [], f"{len(errors)} failed calls, first: {errors[0]!r}"

    # -- enrolment: every batch complete, each key enrolled exactly once (one True overall)
    assert len(results) == ENROLLERS * BATCHES
    first_ids: dict[bytes, int] = {}
    new_count: dict[bytes, int] = {}
    for (t, b), got in results.items():
        first = (t * BATCHES + b) * BATCH // 2
        assert [k for _, k, _ in got] == [key(n) for n in range(first, first + BATCH)]
        for device_id, k, new in got:
            assert first_ids.setdefault(k, device_id) == device_id, "one key, two device ids"
            new_count[k] = new_count.get(k, 0) + int(new)
    assert set(new_count.values()) == {1}, "a key was newly enrolled zero or several times"
    stored = main.list_devices()
    by_key = {d.identity_public_key: d for d in stored}
    assert len(by_key) == len(stored) == len(first_ids) + 1  # + the revoked device
    assert all(by_key[k].id == i for k, i in first_ids.items())
    # -- refused batches left nothing behind
    assert len(refused) == ENROLLERS * (BATCHES // 3)
    assert not any(k in by_key for batch in refused for k in batch)

    # -- rounds: unique numbers, every commit present and exact, every abort recorded
    numbers = sorted([*committed, *aborted])
    assert len(numbers) == ROUND_WRITERS * ROUNDS_EACH == len(set(numbers))
    ledger = {e.round_number: e for e in main.privacy_ledger()}
    assert set(ledger) == set(committed)
    for n, version_id in committed.items():
        r = main.get_round(n)
        assert r is not None and r.state is RoundState.COMMITTED
        v = main.get_model_version(version_id)
        assert v.round_number == n and v.parameters == blob_of(n) and v.hyperparameters == {"round": n}
        assert ledger[n].cumulative_epsilon == pytest.approx(0.1 * n)
    for n in aborted:
        r = main.get_round(n)
        assert r is not None and r.state is RoundState.ABORTED and r.abort_reason == "too_few_survivors"
    versions = main.list_model_versions(limit=1000).items
    assert sorted(v.round_number for v in versions if v.round_number is not None) == sorted(committed)



TWIN_ROUNDS = 40


@pytest.mark.timeout(60)
def test_the_same_fresh_keys_and_handles_enrolled_twice_at_once_get_the_same_ids(backend: Any) -> None:
    """Two calls of one client enrol the same fresh keys with the same user
    handles at the same moment (a retried RPC racing its original), while
    other enrolments run: both calls return the same ids, never a refusal
    (D23: enrolment is idempotent per key, also against a concurrent call).
    On PostgreSQL under READ COMMITTED the other call can commit between
    the lookup of the keys and the lookup of the handles; that must not
    read as "the handle is taken"."""
    stores: list[Store] = []

    def own_store() -> Store:
        if backend.url is None:
            return backend.store
        s = open_store(backend.url, migrate=False)
        stores.append(s)
        return s

    twins = [own_store(), own_store()]
    others = [own_store(), own_store()]
    gate = threading.Barrier(2)
    got: dict[int, list[list[tuple[int, bool]]]] = {0: [], 1: []}
    stop = threading.Event()

    def twin(t: int) -> Callable[[], None]:
        def run() -> None:
            try:
                for r in range(TWIN_ROUNDS):
                    batch = [(key(50_000 + 4 * r + i), f"twin-{r}-{i}") for i in range(4)]
                    gate.wait(10)
                    got[t].append([(rec.id, new) for rec, new in twins[t].enroll_devices(batch, client_id="client-a")])
            except BaseException:
                gate.abort()  # the other twin stops waiting
                raise
            finally:
                stop.set()

        return run

    def other(o: int) -> Callable[[], None]:
        def run() -> None:
            n = 0
            while not stop.is_set():
                first = 100_000 + 1_000 * o + 4 * n
                others[o].enroll_devices([(key(first + i), f"other-{o}-{n}-{i}") for i in range(4)],
                                         client_id="client-b")
                n += 1
                stop.wait(0.002)

        return run

    try:
        errors = run_threads([twin(0), twin(1), other(0), other(1)])
    finally:
        for s in stores:
            s.close()
    assert errors == [], f"{len(errors)} failed calls, first: {errors[0]!r}"
    assert len(got[0]) == len(got[1]) == TWIN_ROUNDS
    for a, b in zip(got[0], got[1], strict=True):
        assert [i for i, _ in a] == [i for i, _ in b], "the two calls got different ids"
        assert all(x != y for (_, x), (_, y) in zip(a, b, strict=True)), "each key is new to exactly one call"
