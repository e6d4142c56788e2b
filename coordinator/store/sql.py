"""SQLAlchemy implementation of the Store (SQLite file or PostgreSQL).

Every public method is one transaction (`with self._tx() as session`); any
exception rolls it back, and SQLAlchemy/driver errors are re-raised as
StoreError subclasses. Rows never leave this module: methods return the
immutable records of coordinator.store.records.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, func, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from coordinator.store.errors import (
    ConflictError,
    CorruptBlobError,
    InvalidRecordError,
    NotFoundError,
    StoreError,
)
from coordinator.store.orm import DeviceRow, ModelVersionRow, PrivacyLedgerRow, RoundRow
from coordinator.store.records import (
    COORDINATOR_RESTART,
    DeviceRecord,
    DeviceStatus,
    ModelVersion,
    ModelVersionSummary,
    NewModelVersion,
    Page,
    PrivacyEntry,
    PrivacySummary,
    RoundRecord,
    RoundState,
    sha256_hex,
    utc_now,
)
from coordinator.store.summaries import check_commit_args, page_of, summarize_privacy, validate_limit

_TERMINAL = (RoundState.COMMITTED.value, RoundState.ABORTED.value)


class SqlStore:
    """A Store on an Engine from coordinator.store.engine.create_store_engine.

    The schema must be at head (coordinator.store.migrate.upgrade_to_head);
    `coordinator.store.open_store` does both.
    """

    def __init__(self, engine: Engine, *, clock: Callable[[], datetime] = utc_now) -> None:
        self._engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._clock = clock

    @property
    def engine(self) -> Engine:
        return self._engine

    @contextmanager
    def _tx(self) -> Iterator[Session]:
        try:
            with self._sessions.begin() as session:
                yield session
        except StoreError:
            raise
        except IntegrityError as exc:
            raise ConflictError(f"constraint violated: {exc.orig}") from exc
        except SQLAlchemyError as exc:
            raise StoreError(f"database error: {exc}") from exc

    # ------------------------------------------------------------ devices
    def enroll_device(
        self, identity_public_key: bytes, *, local_id: str = "", client_id: str | None = None
    ) -> tuple[DeviceRecord, bool]:
        key = bytes(identity_public_key)
        with self._tx() as s:
            row = s.scalars(select(DeviceRow).where(DeviceRow.identity_public_key == key)).first()
            if row is not None:
                return _device(row), False
            row = DeviceRow(
                identity_public_key=key,
                local_id=local_id,
                client_id=client_id,
                enrolled_at=self._clock(),
                status=DeviceStatus.ACTIVE.value,
            )
            s.add(row)
            s.flush()
            return _device(row), True

    def get_device(self, device_id: int) -> DeviceRecord | None:
        with self._tx() as s:
            row = s.get(DeviceRow, device_id)
            return None if row is None else _device(row)

    def list_devices(self, *, status: DeviceStatus | None = None) -> list[DeviceRecord]:
        query = select(DeviceRow).order_by(DeviceRow.id)
        if status is not None:
            query = query.where(DeviceRow.status == DeviceStatus(status).value)
        with self._tx() as s:
            return [_device(r) for r in s.scalars(query)]

    def mark_devices_seen(self, device_ids: Iterable[int], at: datetime | None = None) -> None:
        ids = sorted(set(device_ids))
        if not ids:
            return
        with self._tx() as s:
            s.execute(update(DeviceRow).where(DeviceRow.id.in_(ids)).values(last_seen_at=at or self._clock()))

    def set_device_status(self, device_id: int, status: DeviceStatus) -> DeviceRecord:
        with self._tx() as s:
            row = s.get(DeviceRow, device_id)
            if row is None:
                raise NotFoundError(f"device {device_id} is not enrolled")
            row.status = DeviceStatus(status).value
            return _device(row)

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

    def add_model_version(self, version: NewModelVersion) -> ModelVersionSummary:
        with self._tx() as s:
            return _model_summary(self._insert_model(s, version, None), len(version.parameters))

    def latest_model_version(self, model_name: str | None = None) -> ModelVersion | None:
        query = select(ModelVersionRow).order_by(ModelVersionRow.id.desc()).limit(1)
        if model_name is not None:
            query = query.where(ModelVersionRow.model_name == model_name)
        with self._tx() as s:
            row = s.scalars(query).first()
            return None if row is None else _verified_model(row)

    def get_model_version(self, version_id: int) -> ModelVersion:
        with self._tx() as s:
            row = s.get(ModelVersionRow, version_id)
            if row is None:
                raise NotFoundError(f"model version {version_id} does not exist")
            return _verified_model(row)

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
        with self._tx() as s:
            items = tuple(
                ModelVersionSummary(
                    id=r[0], round_number=r[1], created_at=r[2], model_name=r[3], sha256=r[4],
                    size_bytes=int(r[5]), hyperparameters=r[6],
                )
                for r in s.execute(query)
            )
        return page_of(items, limit, lambda v: v.id)

    # -------------------------------------------------------------- rounds
    def next_round_number(self) -> int:
        with self._tx() as s:
            return int(s.scalar(select(func.coalesce(func.max(RoundRow.number), 0))) or 0) + 1

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
        with self._tx() as s:
            self._write_round(s, record)

    def commit_round(
        self,
        round_record: RoundRecord,
        new_model_version: NewModelVersion,
        privacy_entry: PrivacyEntry | None,
    ) -> ModelVersionSummary:
        check_commit_args(round_record, privacy_entry)
        with self._tx() as s:  # one transaction: all three writes or none
            self._write_round(s, round_record)
            model = self._insert_model(s, new_model_version, round_record.number)
            if privacy_entry is not None:
                s.add(_ledger_row(privacy_entry))
                s.flush()
            return _model_summary(model, len(new_model_version.parameters))

    def abort_round(self, round_record: RoundRecord) -> None:
        if round_record.state is not RoundState.ABORTED:
            raise InvalidRecordError(f"abort_round got state {round_record.state}")
        with self._tx() as s:
            self._write_round(s, round_record)

    def mark_interrupted_rounds_aborted(self, *, at: datetime | None = None) -> list[int]:
        when = at or self._clock()
        with self._tx() as s:
            rows = s.scalars(
                select(RoundRow).where(RoundRow.state.not_in(_TERMINAL)).order_by(RoundRow.number).with_for_update()
            ).all()
            for row in rows:
                row.state = RoundState.ABORTED.value
                row.abort_reason = COORDINATOR_RESTART
                row.ended_at = when
            return [row.number for row in rows]

    def get_round(self, number: int) -> RoundRecord | None:
        with self._tx() as s:
            row = s.scalars(select(RoundRow).where(RoundRow.number == number)).first()
            return None if row is None else _round(row)

    def list_rounds(self, *, limit: int = 50, before: int | None = None) -> Page[RoundRecord]:
        validate_limit(limit)
        query = select(RoundRow).order_by(RoundRow.number.desc()).limit(limit + 1)
        if before is not None:
            query = query.where(RoundRow.number < before)
        with self._tx() as s:
            items = tuple(_round(r) for r in s.scalars(query))
        return page_of(items, limit, lambda r: r.number)

    # ------------------------------------------------------------- privacy
    def privacy_ledger(self) -> list[PrivacyEntry]:
        with self._tx() as s:
            rows = s.scalars(select(PrivacyLedgerRow).order_by(PrivacyLedgerRow.round_number))
            return [
                PrivacyEntry(
                    round_number=r.round_number, epsilon=r.epsilon, delta=r.delta,
                    noise_multiplier=r.noise_multiplier, sampling_rate=r.sampling_rate,
                    cumulative_epsilon=r.cumulative_epsilon,
                )
                for r in rows
            ]

    def privacy_summary(self) -> PrivacySummary:
        return summarize_privacy(self.privacy_ledger())

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


def _ledger_row(entry: PrivacyEntry) -> PrivacyLedgerRow:
    return PrivacyLedgerRow(
        round_number=entry.round_number, epsilon=entry.epsilon, delta=entry.delta,
        noise_multiplier=entry.noise_multiplier, sampling_rate=entry.sampling_rate,
        cumulative_epsilon=entry.cumulative_epsilon,
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

