"""SQLAlchemy 2 ORM tables of the SQL store (typed `Mapped[...]`).

The schema itself is owned by the Alembic migrations in ./migrations; a test
checks that these models and the migrated database never diverge
(alembic's compare_metadata finds no difference, on SQLite and PostgreSQL).

Portability: ids are BIGINT (INTEGER on SQLite, where only that aliases the
rowid), JSON is JSONB on PostgreSQL, timestamps are stored in UTC
(TIMESTAMP WITH TIME ZONE on PostgreSQL, naive UTC text on SQLite) and always
come back timezone-aware. Enumerations are plain strings validated in Python,
so adding a state never needs an ALTER TYPE / CHECK migration.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Double,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    TypeDecorator,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

#: Primary keys: BIGINT, but INTEGER on SQLite so it autoincrements.
Id = BigInteger().with_variant(Integer(), "sqlite")
JsonDoc = JSON().with_variant(JSONB(), "postgresql")


class UTCDateTime(TypeDecorator[datetime]):
    """Aware datetimes in, aware UTC datetimes out, on every backend."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: the store needs timezone-aware values")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {
        datetime: UTCDateTime(),
        bytes: LargeBinary(),
        float: Double(),
        dict[str, Any]: JsonDoc,
    }


#: A non-empty local_id (the user handle) is unique (migration 0003).
HANDLE_INDEX = "uq_devices_local_id_handle"


class DeviceRow(Base):
    __tablename__ = "devices"
    __table_args__ = (
        Index(HANDLE_INDEX, "local_id", unique=True,
              sqlite_where=text("local_id <> ''"), postgresql_where=text("local_id <> ''")),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    local_id: Mapped[str] = mapped_column(String(255), default="")
    client_id: Mapped[str | None] = mapped_column(String(255))
    identity_public_key: Mapped[bytes] = mapped_column(unique=True)
    enrolled_at: Mapped[datetime]
    status: Mapped[str] = mapped_column(String(16))
    last_seen_at: Mapped[datetime | None]


class RoundRow(Base):
    __tablename__ = "rounds"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    number: Mapped[int] = mapped_column(BigInteger, unique=True)
    state: Mapped[str] = mapped_column(String(32), index=True)
    started_at: Mapped[datetime]
    ended_at: Mapped[datetime | None]
    abort_reason: Mapped[str | None] = mapped_column(String(64))
    cohort_size: Mapped[int] = mapped_column(Integer)
    base_model_version: Mapped[int | None] = mapped_column(BigInteger)
    survivors: Mapped[dict[str, Any]]
    dropouts: Mapped[dict[str, Any]]
    timings: Mapped[dict[str, Any]]
    metrics: Mapped[dict[str, Any]]


class RoundCounterRow(Base):
    """One row (id = COUNTER_ID): the last round number handed out by
    next_round_number (migration 0002 seeds it)."""

    __tablename__ = "round_counter"

    COUNTER_ID = 1

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    last_number: Mapped[int] = mapped_column(BigInteger)


class ModelVersionRow(Base):
    __tablename__ = "model_versions"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    round_number: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey("rounds.number"), unique=True
    )
    created_at: Mapped[datetime]
    model_name: Mapped[str] = mapped_column(String(64), index=True)
    parameters: Mapped[bytes]
    sha256: Mapped[str] = mapped_column(String(64))
    hyperparameters: Mapped[dict[str, Any]]


class PrivacyLedgerRow(Base):
    __tablename__ = "privacy_ledger"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    round_number: Mapped[int] = mapped_column(BigInteger, ForeignKey("rounds.number"), unique=True)
    epsilon: Mapped[float]
    delta: Mapped[float]
    noise_multiplier: Mapped[float]
    sampling_rate: Mapped[float]
    cumulative_epsilon: Mapped[float]
    #: A round in groups (migration 0006, D99): [{size, counted, noise_multiplier}] of the groups whose sums
    #: were released; NULL for a round of one instance.
    groups: Mapped[list[dict[str, Any]] | None] = mapped_column(JsonDoc, nullable=True)


class AuditRow(Base):
    """The operator audit log (migration 0003): append-only."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    at: Mapped[datetime]
    operator: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(64))
    outcome: Mapped[str] = mapped_column(String(1024))
    details: Mapped[dict[str, Any]]


class ShareReportRow(Base):
    """Counted share-check reports (migration 0004, D37)."""

    __tablename__ = "share_reports"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    round_number: Mapped[int] = mapped_column(BigInteger, index=True)
    at: Mapped[datetime]
    reporter: Mapped[str] = mapped_column(String(255))
    reported: Mapped[int] = mapped_column(BigInteger, index=True)


class QuarantineRow(Base):
    """Quarantines started by share reports (migration 0004, D37); `charged`
    is a JSON list of the credentials whose quota it used."""

    __tablename__ = "quarantines"

    id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    device_id: Mapped[int] = mapped_column(BigInteger, index=True)
    started_round: Mapped[int] = mapped_column(BigInteger)
    started_at: Mapped[datetime]
    until_round: Mapped[int] = mapped_column(BigInteger)
    until: Mapped[datetime]
    charged: Mapped[dict[str, Any]]
    released_at: Mapped[datetime | None]


class LeaderLeaseRow(Base):
    """The one leader lease (migration 0005, D90): `expires_at` in seconds
    since the epoch by the database's clock; `token` grows on every takeover."""

    __tablename__ = "leader_lease"
    __table_args__ = (CheckConstraint("id = 1", name="one_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    holder: Mapped[str | None] = mapped_column(String(255))
    token: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[float] = mapped_column(Double)


class ReplicaRow(Base):
    """A coordinator replica's membership of the tier (migration 0007): a
    lease per name, `expires_at` and `joined_at` in seconds since the epoch
    by the database's clock, `token` growing on every new term (0: never
    joined). `streams_version` is the fleet version of its last publish
    that changed a stream row. `state` and `state_at` are reserved for a
    status document of the replica; nothing writes them yet (NULL)."""

    __tablename__ = "replicas"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    token: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[float] = mapped_column(Double)
    joined_at: Mapped[float] = mapped_column(Double)
    settings_digest: Mapped[str] = mapped_column(String(64))
    device_address: Mapped[str | None] = mapped_column(String(255))
    admin_address: Mapped[str | None] = mapped_column(String(255))
    streams_version: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[dict[str, Any] | None] = mapped_column(JsonDoc, nullable=True)
    state_at: Mapped[float | None] = mapped_column(Double)


class DeviceStreamRow(Base):
    """Which replica (and term, `replica_token`) holds a device's stream
    (migration 0007); `claim` is the fleet version of the publish that
    wrote the claim, `updated_at` the database's epoch seconds of the last
    write. Only rows of a running term count."""

    __tablename__ = "device_streams"

    device_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("devices.id"), primary_key=True,
                                           autoincrement=False)
    replica: Mapped[str] = mapped_column(String(255), index=True)
    replica_token: Mapped[int] = mapped_column(BigInteger)
    session_key: Mapped[int] = mapped_column(BigInteger)
    available: Mapped[bool] = mapped_column(Boolean)
    claim: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[float] = mapped_column(Double)


class FleetCounterRow(Base):
    """One row (id = COUNTER_ID, migration 0007): the fleet version, which
    every change of the replica tier's rows makes grow."""

    __tablename__ = "fleet_counter"
    __table_args__ = (CheckConstraint("id = 1", name="one_row"),)

    COUNTER_ID = 1

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    version: Mapped[int] = mapped_column(BigInteger)


class RoundPlanRow(Base):
    """A round in groups as its leader planned it (migration 0008): see
    group_records.RoundPlan. `new_model_version` is set when it commits."""

    __tablename__ = "round_plans"

    round_number: Mapped[int] = mapped_column(BigInteger, ForeignKey("rounds.number"), primary_key=True,
                                              autoincrement=False)
    lease_token: Mapped[int] = mapped_column(BigInteger)
    nonce: Mapped[bytes]
    model_name: Mapped[str] = mapped_column(String(255))
    model_version: Mapped[int] = mapped_column(BigInteger)
    step: Mapped[int] = mapped_column(Integer)
    hyperparameters: Mapped[dict[str, Any]]
    metric_names: Mapped[list[str]] = mapped_column(JsonDoc)
    cohort_size: Mapped[int] = mapped_column(Integer)
    minimum: Mapped[int] = mapped_column(Integer)
    rotation_key: Mapped[bytes]
    deadlines: Mapped[dict[str, Any]]
    task_deadlines: Mapped[dict[str, Any]]
    opened_at: Mapped[datetime]
    closes_at: Mapped[datetime]
    devices_left_out: Mapped[int] = mapped_column(Integer)
    left_out: Mapped[dict[str, Any]]
    new_model_version: Mapped[int | None] = mapped_column(BigInteger)


class RoundGroupRow(Base):
    """One group of a planned round (migration 0008): the replica and term
    running it, its members and settings, its state (`lost_in`: the state a
    lost group was in) and what its replica last saved; `updated_at` is the
    database's epoch seconds of the last write. See group_records.GroupRow."""

    __tablename__ = "round_groups"

    round_number: Mapped[int] = mapped_column(BigInteger, ForeignKey("round_plans.round_number"),
                                              primary_key=True, autoincrement=False)
    group_index: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    replica: Mapped[str] = mapped_column(String(255))
    replica_token: Mapped[int] = mapped_column(BigInteger)
    members: Mapped[list[int]] = mapped_column(JsonDoc)
    secagg_settings: Mapped[bytes]
    session_id: Mapped[bytes]
    dp_settings: Mapped[bytes | None]
    state: Mapped[str] = mapped_column(String(16))
    lost_in: Mapped[str | None] = mapped_column(String(16))
    phase: Mapped[str] = mapped_column(String(32))
    asked: Mapped[list[int] | None] = mapped_column(JsonDoc)
    survivors: Mapped[dict[str, Any]]
    dropouts: Mapped[dict[str, Any]]
    timings: Mapped[dict[str, Any]]
    completion: Mapped[dict[str, Any]]
    counted: Mapped[list[int] | None] = mapped_column(JsonDoc)
    share_reports: Mapped[list[Any]] = mapped_column(JsonDoc)
    share_check_survivors: Mapped[list[int]] = mapped_column(JsonDoc)
    fail_reason: Mapped[str | None] = mapped_column(String(64))
    updated_at: Mapped[float] = mapped_column(Double)


class RoundGroupSumRow(Base):
    """A done group's unmasked sum while its round runs (migration 0008;
    deleted when the round is sealed): little-endian uint32 coordinates,
    sha256 of both blobs. The read-only role never reads this table."""

    __tablename__ = "round_group_sums"
    __table_args__ = (ForeignKeyConstraint(["round_number", "group_index"],
                                           ["round_groups.round_number", "round_groups.group_index"],
                                           name="fk_round_group_sums_group"),)

    round_number: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    group_index: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    encoded_sum: Mapped[bytes]
    metric_limbs: Mapped[bytes]
    vector_length: Mapped[int] = mapped_column(Integer)
    metric_coordinates: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))


class TierSecretRow(Base):
    """One row (id = SECRET_ID, migration 0009, which draws it): the replica
    tier's 32-byte secret (Store.tier_secret). The read-only role never
    reads this table."""

    __tablename__ = "tier_secret"
    __table_args__ = (CheckConstraint("id = 1", name="one_row"),)

    SECRET_ID = 1

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    secret: Mapped[bytes] = mapped_column(LargeBinary)
