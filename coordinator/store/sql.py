"""SQLAlchemy implementation of the Store (SQLite file or PostgreSQL).

Every public method is one transaction: `self._read(body)` or
`self._write(body)` runs `body(session)` in a transaction of that kind
(coordinator.store.transactions: BEGIN DEFERRED / BEGIN IMMEDIATE on SQLite,
READ COMMITTED on PostgreSQL). Any exception rolls it back; SQLAlchemy and
driver errors are re-raised as StoreError subclasses. Rows never leave this
module: bodies return the immutable records of coordinator.store.records.

Concurrency:
  * SQLite: write transactions of one SqlStore are serialised by a lock of
    the store (threads queue on it instead of polling SQLite's busy
    handler) and take SQLite's write lock up front (BEGIN IMMEDIATE), so
    writers of other processes wait up to the busy timeout. An in-memory
    SQLite database is one shared connection: every transaction, reads
    included, holds the lock.
  * PostgreSQL: a transaction the server rolled back because of a
    concurrent one (deadlock, serialization failure) is run again from the
    start, at most RETRY.attempts times with jittered backoff. That is safe
    for every body here, idempotent or not: the failed attempt had no
    effect (the server rolled it back before any COMMIT succeeded) and a
    body's only effects are its database writes (it computes its values,
    clock readings included, afresh on each attempt). An error whose
    outcome is unknown (the connection dropped during COMMIT) is never
    retried. Enrolment also retries a unique-key violation on the devices
    key or user handle: the concurrent enrolment of the same key committed
    first, and the next attempt returns that device as already enrolled
    (it reads keys and handles in one statement, one snapshot; see
    `enroll_devices`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Engine, func, or_, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from coordinator.store.engine import is_sqlite_memory
from coordinator.store.errors import (
    ConflictError,
    CorruptBlobError,
    EnrollmentConflictError,
    InvalidRecordError,
    NotFoundError,
    StoreError,
)
from coordinator.store.orm import AuditRow, DeviceRow, ModelVersionRow, PrivacyLedgerRow, RoundCounterRow, RoundRow
from coordinator.store.records import (
    COORDINATOR_RESTART,
    AuditRecord,
    DeviceRecord,
    DeviceStatus,
    GroupCharge,
    ModelVersion,
    ModelVersionSummary,
    NewModelVersion,
    Page,
    PrivacyEntry,
    PrivacySummary,
    RoundRecord,
    RoundState,
    check_audit_fields,
    sha256_hex,
    utc_now,
)
from coordinator.store.retry import RetryPolicy, run_with_retries
from coordinator.store.lease_records import Lease
from coordinator.store.group_records import ChargeRule, merged_unmasking
from coordinator.store.sql_groups import SqlRoundGroups, seal_round
from coordinator.store.sql_lease import SqlLeaderLease, check_fence
from coordinator.store.sql_replicas import SqlReplicas
from coordinator.store.sql_reports import SqlShareReports
from coordinator.store.summaries import (
    check_audit_details,
    check_charge,
    check_commit_args,
    check_enrollment_batch,
    enrollment_refusal,
    page_of,
    summarize_privacy,
    validate_limit,
)
from coordinator.store.transactions import TxKind, execution_options, is_transient, is_unique_violation

_TERMINAL = (RoundState.COMMITTED.value, RoundState.ABORTED.value)
T = TypeVar("T")
log = logging.getLogger("fedmask.coordinator.store")

#: Retries of a PostgreSQL transaction rolled back by a concurrent one.
RETRY = RetryPolicy(attempts=8, base_delay=0.005, max_delay=0.25)
#: Rows read per batch when a whole table is listed (`list_devices`).
LIST_BATCH = 2000


class SqlStore(SqlShareReports, SqlLeaderLease, SqlReplicas, SqlRoundGroups):
    """A Store on an Engine from coordinator.store.engine.create_store_engine
    (share reports and quarantines: the SqlShareReports mixin; the leader
    lease: SqlLeaderLease; replica membership and stream ownership:
    SqlReplicas; round plans and groups: SqlRoundGroups, whose `seal_round`
    the terminal writes call in their transactions).

    The schema must be at head (coordinator.store.migrate.upgrade_to_head);
    `coordinator.store.open_store` does both.
    """

    def __init__(
        self, engine: Engine, *, clock: Callable[[], datetime] = utc_now, retry: RetryPolicy = RETRY
    ) -> None:
        backend = engine.dialect.name
        self._engine = engine
        self._sessions = {
            kind: sessionmaker(engine.execution_options(**execution_options(backend, kind)), expire_on_commit=False)
            for kind in TxKind
        }
        self._clock = clock
        self._retry = retry
        self._sqlite = backend == "sqlite"
        self._lock_reads = self._sqlite and is_sqlite_memory(engine.url)
        self._write_lock = threading.Lock()

    @property
    def engine(self) -> Engine:
        return self._engine

    def _locked(self, kind: TxKind) -> contextlib.AbstractContextManager[object]:
        if self._sqlite and (kind is TxKind.WRITE or self._lock_reads):
            return self._write_lock
        return contextlib.nullcontext()

    def _run(self, kind: TxKind, body: Callable[[Session], T], *, retry_unique: bool = False) -> T:
        """`body(session)` in one transaction of `kind`; see the module docstring."""

        def attempt() -> T:
            with self._locked(kind), self._sessions[kind].begin() as session:
                return body(session)

        def retryable(exc: BaseException) -> bool:
            return is_transient(exc) or (retry_unique and is_unique_violation(exc))

        def on_retry(failures: int, exc: BaseException) -> None:
            log.info("store transaction rolled back by a concurrent one (try %d): %s", failures,
                     getattr(exc, "orig", exc))

        try:
            return run_with_retries(attempt, retryable=retryable, policy=self._retry, on_retry=on_retry)
        except StoreError:
            raise
        except IntegrityError as exc:
            raise ConflictError(f"constraint violated: {exc.orig}") from exc
        except SQLAlchemyError as exc:
            raise StoreError(f"database error: {exc}") from exc

    def _read(self, body: Callable[[Session], T]) -> T:
        return self._run(TxKind.READ, body)

    def _write(self, body: Callable[[Session], T], *, retry_unique: bool = False) -> T:
        return self._run(TxKind.WRITE, body, retry_unique=retry_unique)

    # ------------------------------------------------------------ devices
    def enroll_devices(
        self, devices: Sequence[tuple[bytes, str]], *, client_id: str | None = None
    ) -> list[tuple[DeviceRecord, bool]]:
        keys = check_enrollment_batch(devices)

        handles = [local_id for _, local_id in devices if local_id]
        wanted_keys = set(keys)
        in_the_way: ColumnElement[bool] = DeviceRow.identity_public_key.in_(keys)
        if handles:
            in_the_way = or_(in_the_way, DeviceRow.local_id.in_(handles))

        def body(s: Session) -> list[tuple[DeviceRecord, bool]]:
            # ONE statement reads the batch's keys and handles: under READ
            # COMMITTED each statement has its own snapshot, so with two
            # statements a concurrent enrolment of the same keys and handles
            # could commit in between and its handles read as taken by
            # another device. In one snapshot a handle's holder is either
            # the same key (found: the device is returned as enrolled) or
            # another device. A concurrent enrolment not yet committed is
            # caught by the unique indexes; the retry then reads it here.
            rows = list(s.scalars(select(DeviceRow).where(in_the_way)))
            found = {bytes(r.identity_public_key): r for r in rows if bytes(r.identity_public_key) in wanted_keys}
            for i, key in enumerate(keys):
                row = found.get(key)
                if row is not None:
                    reason = enrollment_refusal(DeviceStatus(row.status), row.client_id, client_id)
                    if reason is not None:
                        raise EnrollmentConflictError(i, row.id, reason)
            # User handles of the new keys: one held by any device refuses the batch.
            holders = {r.local_id: r for r in rows if r.local_id}
            for i, key in enumerate(keys):
                holder = holders.get(devices[i][1]) if key not in found and devices[i][1] else None
                if holder is not None:
                    raise EnrollmentConflictError(i, holder.id, EnrollmentConflictError.HANDLE_TAKEN)
            enrolled_at = self._clock()
            new: dict[bytes, DeviceRow] = {}
            # Inserted in key order: concurrent batches lock the unique index in one order.
            for i in sorted((i for i, k in enumerate(keys) if k not in found), key=lambda i: keys[i]):
                row = DeviceRow(
                    identity_public_key=keys[i],
                    local_id=devices[i][1],
                    client_id=client_id,
                    enrolled_at=enrolled_at,
                    status=DeviceStatus.ACTIVE.value,
                )
                s.add(row)
                new[keys[i]] = row
            s.flush()
            return [(_device(new[k]), True) if k in new else (_device(found[k]), False) for k in keys]

        if not keys:
            return []
        return self._write(body, retry_unique=True)

    def enroll_device(
        self, identity_public_key: bytes, *, local_id: str = "", client_id: str | None = None
    ) -> tuple[DeviceRecord, bool]:
        return self.enroll_devices([(identity_public_key, local_id)], client_id=client_id)[0]

    def get_device(self, device_id: int) -> DeviceRecord | None:
        def body(s: Session) -> DeviceRecord | None:
            row = s.get(DeviceRow, device_id)
            return None if row is None else _device(row)

        return self._read(body)

    def get_device_by_local_id(self, local_id: str) -> DeviceRecord | None:
        if not local_id:
            return None
        query = select(DeviceRow).where(DeviceRow.local_id == local_id).limit(1)
        return self._read(lambda s: next((_device(r) for r in s.scalars(query)), None))

    def list_devices(self, *, status: DeviceStatus | None = None) -> list[DeviceRecord]:
        query = select(DeviceRow).order_by(DeviceRow.id)
        if status is not None:
            query = query.where(DeviceRow.status == DeviceStatus(status).value)
        # streamed in batches: the ORM rows of a large registry never all exist at once (the process's
        # peak at start-up would be theirs, D109's replicas each read the whole registry)
        return self._read(lambda s: [_device(r) for r in s.scalars(query.execution_options(yield_per=LIST_BATCH))])

    def count_devices(self) -> dict[DeviceStatus, int]:
        query = select(DeviceRow.status, func.count()).group_by(DeviceRow.status)
        return self._read(lambda s: {DeviceStatus(status): int(n) for status, n in s.execute(query)})

    def mark_devices_seen(self, device_ids: Iterable[int], at: datetime | None = None) -> None:
        ids = sorted(set(device_ids))
        if not ids:
            return

        def body(s: Session) -> None:
            s.execute(update(DeviceRow).where(DeviceRow.id.in_(ids)).values(last_seen_at=at or self._clock()))

        self._write(body)

    def set_device_status(self, device_id: int, status: DeviceStatus) -> DeviceRecord:
        value = DeviceStatus(status).value

        def body(s: Session) -> DeviceRecord:
            row = s.get(DeviceRow, device_id, with_for_update=True)
            if row is None:
                raise NotFoundError(f"device {device_id} is not enrolled")
            row.status = value
            return _device(row)

        return self._write(body)

    # ------------------------------------------------------ model versions
    def _insert_model(self, s: Session, version: NewModelVersion, round_number: int | None) -> ModelVersionRow:
        row = ModelVersionRow(
            round_number=round_number,
            created_at=version.created_at or self._clock(),
            model_name=version.model_name,
            parameters=version.parameters,
            sha256=sha256_hex(version.parameters),
            hyperparameters=dict(version.hyperparameters),
        )
        s.add(row)
        s.flush()
        return row

    def add_model_version(self, version: NewModelVersion, *, fence: Lease | None = None) -> ModelVersionSummary:
        fence = self._fence_for(fence)

        def body(s: Session) -> ModelVersionSummary:
            check_fence(s, fence)
            return _model_summary(self._insert_model(s, version, None), len(version.parameters))

        return self._write(body)

    def latest_model_version(self, model_name: str | None = None) -> ModelVersion | None:
        query = select(ModelVersionRow).order_by(ModelVersionRow.id.desc()).limit(1)
        if model_name is not None:
            query = query.where(ModelVersionRow.model_name == model_name)

        def body(s: Session) -> ModelVersion | None:
            row = s.scalars(query).first()
            return None if row is None else _verified_model(row)

        return self._read(body)

    def get_model_version(self, version_id: int) -> ModelVersion:
        def body(s: Session) -> ModelVersion:
            row = s.get(ModelVersionRow, version_id)
            if row is None:
                raise NotFoundError(f"model version {version_id} does not exist")
            return _verified_model(row)

        return self._read(body)

    def list_model_versions(self, *, limit: int = 50, before: int | None = None) -> Page[ModelVersionSummary]:
        validate_limit(limit)
        m = ModelVersionRow
        query = (
            select(m.id, m.round_number, m.created_at, m.model_name, m.sha256,
                   func.length(m.parameters), m.hyperparameters)
            .order_by(m.id.desc())
            .limit(limit + 1)
        )
        if before is not None:
            query = query.where(m.id < before)

        def body(s: Session) -> tuple[ModelVersionSummary, ...]:
            return tuple(
                ModelVersionSummary(
                    id=r[0], round_number=r[1], created_at=r[2], model_name=r[3], sha256=r[4],
                    size_bytes=int(r[5]), hyperparameters=r[6],
                )
                for r in s.execute(query)
            )

        return page_of(self._read(body), limit, lambda v: v.id)

    # -------------------------------------------------------------- rounds
    def next_round_number(self) -> int:
        def body(s: Session) -> int:
            # The counter row is locked first (FOR UPDATE on PostgreSQL; SQLite's
            # write lock is already held): allocations are serialised, and the
            # max over rounds below is read after every earlier allocation committed.
            counter = s.get(RoundCounterRow, RoundCounterRow.COUNTER_ID, with_for_update=True)
            highest = int(s.scalar(select(func.coalesce(func.max(RoundRow.number), 0))) or 0)
            number = max(highest, counter.last_number if counter is not None else 0) + 1
            if counter is None:  # (migration 0002 creates it; a concurrent creation is retried)
                s.add(RoundCounterRow(id=RoundCounterRow.COUNTER_ID, last_number=number))
            else:
                counter.last_number = number
            s.flush()
            return number

        return self._write(body, retry_unique=True)

    def _writable_round(self, s: Session, number: int) -> RoundRow | None:
        row = s.scalars(select(RoundRow).where(RoundRow.number == number).with_for_update()).first()
        if row is not None and row.state in _TERMINAL:
            raise ConflictError(f"round {number} is already {row.state}")
        return row

    def _write_round(self, s: Session, record: RoundRecord) -> RoundRow:
        row = self._writable_round(s, record.number)
        if row is None:
            row = RoundRow(number=record.number)
            s.add(row)
        row.state = record.state.value
        row.started_at = record.started_at
        row.ended_at = record.ended_at
        row.abort_reason = record.abort_reason
        row.cohort_size = record.cohort_size
        row.base_model_version = record.base_model_version
        row.survivors = {k: list(v) for k, v in record.survivors.items()}
        row.dropouts = {k: list(v) for k, v in record.dropouts.items()}
        row.timings = dict(record.timings)
        row.metrics = dict(record.metrics)
        s.flush()
        return row

    def save_round_progress(self, record: RoundRecord) -> None:
        if record.state.is_terminal:
            raise InvalidRecordError(f"save_round_progress got terminal state {record.state}")
        self._write(lambda s: self._write_round(s, record).number)

    def commit_round(
        self,
        round_record: RoundRecord,
        new_model_version: NewModelVersion,
        privacy_entry: PrivacyEntry | None,
        *,
        fence: Lease | None = None,
    ) -> ModelVersionSummary:
        check_commit_args(round_record, privacy_entry)
        fence = self._fence_for(fence)

        def body(s: Session) -> ModelVersionSummary:  # one transaction: all three writes or none
            check_fence(s, fence)
            self._write_round(s, round_record)
            model = self._insert_model(s, new_model_version, round_record.number)
            seal_round(s, round_record.number, model.id)
            if privacy_entry is not None:
                s.add(_ledger_row(privacy_entry))
                s.flush()
            return _model_summary(model, len(new_model_version.parameters))

        return self._write(body)

    def abort_round(self, round_record: RoundRecord, *, fence: Lease | None = None,
                    privacy_entry: PrivacyEntry | None = None) -> None:
        if round_record.state is not RoundState.ABORTED:
            raise InvalidRecordError(f"abort_round got state {round_record.state}")
        fence = self._fence_for(fence)

        def body(s: Session) -> None:
            check_fence(s, fence)
            self._write_round(s, round_record)
            seal_round(s, round_record.number, None)
            entry = check_charge(privacy_entry, round_record.number,
                                 {e.round_number for e in _ledger(s)} if privacy_entry is not None else ())
            if entry is not None:
                s.add(_ledger_row(entry))

        self._write(body)

    def mark_interrupted_rounds_aborted(self, *, at: datetime | None = None, charge: ChargeRule | None = None,
                                        fence: Lease | None = None) -> list[int]:
        fence = self._fence_for(fence)

        def body(s: Session) -> list[int]:
            check_fence(s, fence)
            when = at or self._clock()
            rows = s.scalars(
                select(RoundRow).where(RoundRow.state.not_in(_TERMINAL)).order_by(RoundRow.number).with_for_update()
            ).all()
            for row in rows:
                found = _round(row)
                groups = seal_round(s, row.number, None)  # the charge rule sees the sealed rows
                row.survivors = merged_unmasking(row.survivors, groups)
                row.state = RoundState.ABORTED.value
                row.abort_reason = COORDINATOR_RESTART
                row.ended_at = when
                if charge is not None:
                    ledger = _ledger(s)
                    entry = check_charge(charge(found, ledger, groups), row.number, {e.round_number for e in ledger})
                    if entry is not None:
                        s.add(_ledger_row(entry))
                s.flush()
            return [row.number for row in rows]

        return self._write(body)

    def get_round(self, number: int) -> RoundRecord | None:
        def body(s: Session) -> RoundRecord | None:
            row = s.scalars(select(RoundRow).where(RoundRow.number == number)).first()
            return None if row is None else _round(row)

        return self._read(body)

    def list_rounds(self, *, limit: int = 50, before: int | None = None) -> Page[RoundRecord]:
        validate_limit(limit)
        query = select(RoundRow).order_by(RoundRow.number.desc()).limit(limit + 1)
        if before is not None:
            query = query.where(RoundRow.number < before)
        items = self._read(lambda s: tuple(_round(r) for r in s.scalars(query)))
        return page_of(items, limit, lambda r: r.number)

    # ------------------------------------------------------------- privacy
    def privacy_ledger(self) -> list[PrivacyEntry]:
        return self._read(_ledger)

    def privacy_summary(self) -> PrivacySummary:
        return summarize_privacy(self.privacy_ledger())

    # ----------------------------------------------------------- audit log
    def append_audit(
        self, *, operator: str, action: str, outcome: str,
        details: Mapping[str, Any] | None = None, at: datetime | None = None,
    ) -> AuditRecord:
        check_audit_fields(operator, action, outcome)
        clean = check_audit_details(details)

        def body(s: Session) -> AuditRecord:
            row = AuditRow(at=at or self._clock(), operator=operator, action=action, outcome=outcome, details=clean)
            s.add(row)
            s.flush()
            return _audit(row)

        return self._write(body)

    def list_audit(self, *, limit: int = 50, before: int | None = None) -> Page[AuditRecord]:
        validate_limit(limit)
        query = select(AuditRow).order_by(AuditRow.id.desc()).limit(limit + 1)
        if before is not None:
            query = query.where(AuditRow.id < before)
        items = self._read(lambda s: tuple(_audit(r) for r in s.scalars(query)))
        return page_of(items, limit, lambda e: e.id)

    def close(self) -> None:
        self._engine.dispose()


# ---------------------------------------------------------------- mapping
def _device(row: DeviceRow) -> DeviceRecord:
    return DeviceRecord(
        id=row.id,
        identity_public_key=bytes(row.identity_public_key),
        enrolled_at=row.enrolled_at,
        status=DeviceStatus(row.status),
        last_seen_at=row.last_seen_at,
        local_id=row.local_id,
        client_id=row.client_id,
    )


def _audit(row: AuditRow) -> AuditRecord:
    return AuditRecord(id=row.id, at=row.at, operator=row.operator, action=row.action, outcome=row.outcome,
                      details=dict(row.details))


def _round(row: RoundRow) -> RoundRecord:
    return RoundRecord(
        number=row.number,
        state=RoundState(row.state),
        started_at=row.started_at,
        ended_at=row.ended_at,
        abort_reason=row.abort_reason,
        cohort_size=row.cohort_size,
        base_model_version=row.base_model_version,
        survivors=row.survivors,
        dropouts=row.dropouts,
        timings=row.timings,
        metrics=row.metrics,
    )


def _ledger(s: Session) -> list[PrivacyEntry]:
    """The privacy ledger, ascending round number."""
    rows = s.scalars(select(PrivacyLedgerRow).order_by(PrivacyLedgerRow.round_number))
    return [
        PrivacyEntry(
            round_number=r.round_number, epsilon=r.epsilon, delta=r.delta, noise_multiplier=r.noise_multiplier,
            sampling_rate=r.sampling_rate, cumulative_epsilon=r.cumulative_epsilon,
            groups=tuple(GroupCharge(size=int(g["size"]), counted=int(g["counted"]),
                                     noise_multiplier=float(g["noise_multiplier"])) for g in r.groups or ()),
        )
        for r in rows
    ]


def _ledger_row(entry: PrivacyEntry) -> PrivacyLedgerRow:
    return PrivacyLedgerRow(
        round_number=entry.round_number, epsilon=entry.epsilon, delta=entry.delta,
        noise_multiplier=entry.noise_multiplier, sampling_rate=entry.sampling_rate,
        cumulative_epsilon=entry.cumulative_epsilon,
        groups=[g.as_json() for g in entry.groups] or None,
    )


def _model_summary(row: ModelVersionRow, size: int) -> ModelVersionSummary:
    return ModelVersionSummary(
        id=row.id, round_number=row.round_number, created_at=row.created_at,
        model_name=row.model_name, sha256=row.sha256, size_bytes=size,
        hyperparameters=dict(row.hyperparameters),
    )


def _verified_model(row: ModelVersionRow) -> ModelVersion:
    blob = bytes(row.parameters)
    actual = sha256_hex(blob)
    if actual != row.sha256:
        raise CorruptBlobError(row.id, row.sha256, actual)
    return ModelVersion(
        id=row.id, round_number=row.round_number, created_at=row.created_at,
        model_name=row.model_name, sha256=row.sha256, size_bytes=len(blob),
        hyperparameters=dict(row.hyperparameters), parameters=blob,
    )

