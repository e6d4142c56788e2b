"""Schema management and backend settings of the SQL store, on SQLite and a
real PostgreSQL (`sql_url` fixture), plus the parameter-blob format."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from typing import Any

import numpy as np
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, insert, text
from sqlalchemy.exc import IntegrityError

from coordinator.store import (
    GroupAssignment,
    GroupState,
    RoundPlan,
    RoundRecord,
    RoundState,
    StoreError,
    StreamClaim,
    StreamOwner,
    open_store,
)
from coordinator.store.blobs import pack_parameters, unpack_parameters
from coordinator.store.engine import create_store_engine, normalize_url
from coordinator.store.migrate import alembic_config, current_revision, head_revision, upgrade_to_head
from coordinator.store.orm import Base, PrivacyLedgerRow

TABLES = {"devices", "rounds", "round_counter", "model_versions", "privacy_ledger", "audit_log", "share_reports",
          "quarantines", "leader_lease", "replicas", "device_streams", "fleet_counter", "round_plans", "round_groups",
          "round_group_sums", "tier_secret", "alembic_version"}
GROUP_TABLES = {"round_plans", "round_groups", "round_group_sums"}
SECRET_TABLES = {"tier_secret"}


def test_upgrade_creates_the_schema_and_is_idempotent(sql_url: str) -> None:
    engine = create_store_engine(sql_url)
    try:
        assert current_revision(engine) is None
        upgrade_to_head(engine)
        upgrade_to_head(engine)
        assert current_revision(engine) == head_revision()
        assert set(inspect(engine).get_table_names()) == TABLES
    finally:
        engine.dispose()


def test_migrations_match_the_orm_models(sql_url: str) -> None:
    engine = create_store_engine(sql_url)
    try:
        upgrade_to_head(engine)
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(ctx, Base.metadata)
        assert diff == [], f"orm.py and the migrations diverge: {diff}"
    finally:
        engine.dispose()


def test_downgrade_to_base_and_back(sql_url: str) -> None:
    engine = create_store_engine(sql_url)
    try:
        upgrade_to_head(engine)
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        upgrade_to_head(engine)
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()


def test_round_counter_migration_continues_after_the_stored_rounds(sql_url: str) -> None:
    """A database created before migration 0002 keeps its round numbers:
    the counter is seeded with the highest one."""
    engine = create_store_engine(sql_url)
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "0001_initial")
            conn.execute(text(
                "INSERT INTO rounds (number, state, started_at, cohort_size, survivors, dropouts, timings, metrics)"
                " VALUES (7, 'committed', '2025-01-01 00:00:00', 3, '{}', '{}', '{}', '{}')"
            ))
        upgrade_to_head(engine)
    finally:
        engine.dispose()
    store = open_store(sql_url)
    try:
        assert store.next_round_number() == 8
    finally:
        store.close()


def test_handle_migration_renames_duplicate_local_ids(sql_url: str) -> None:
    """A database from before migration 0003 may hold one local_id twice:
    the older device keeps it, the other becomes "<local_id>#<id>", and the
    handle is unique from then on."""
    engine = create_store_engine(sql_url)
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "0002_round_counter")
            for key in (b"A" * 32, b"B" * 32, b"C" * 32):
                conn.execute(text(
                    "INSERT INTO devices (local_id, identity_public_key, enrolled_at, status)"
                    " VALUES (:lid, :key, '2025-01-01 00:00:00', 'active')"), {"lid": "user-1", "key": key})
        upgrade_to_head(engine)
    finally:
        engine.dispose()
    store = open_store(sql_url)
    try:
        assert [d.local_id for d in store.list_devices()] == ["user-1", "user-1#2", "user-1#3"]
        assert store.get_device_by_local_id("user-1") == store.get_device(1)
    finally:
        store.close()


def test_replica_tier_migration_upgrades_and_downgrades(sql_url: str) -> None:
    """0007 adds the replica tier's tables to a database of 0006 (its devices
    kept, the fleet counter at 0) and its downgrade drops them again, rows
    and all, leaving the rest as it was."""
    engine = create_store_engine(sql_url)
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "0006_ledger_groups")
            conn.execute(text("INSERT INTO devices (local_id, identity_public_key, enrolled_at, status)"
                              " VALUES ('user-1', :key, '2025-01-01 00:00:00', 'active')"), {"key": b"A" * 32})
        assert set(inspect(engine).get_table_names()) == TABLES - {"replicas", "device_streams", "fleet_counter"} - GROUP_TABLES - SECRET_TABLES
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "0007_replica_streams")
            assert conn.execute(text("SELECT id, version FROM fleet_counter")).all() == [(1, 0)]
        store = open_store(sql_url, migrate=False)
        try:
            member = store.join_tier("replica-a", 30.0, settings_digest="")
            assert member is not None
            store.publish_streams(member, claims=[StreamClaim(1, 7, True)])
            assert store.stream_owner(1) == StreamOwner("replica-a", 7, True) and store.fleet_version() == 2
        finally:
            store.close()
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0006_ledger_groups")
        assert set(inspect(engine).get_table_names()) == TABLES - {"replicas", "device_streams", "fleet_counter"} - GROUP_TABLES - SECRET_TABLES
        assert current_revision(engine) == "0006_ledger_groups"
        with engine.connect() as conn:
            assert conn.execute(text("SELECT local_id FROM devices")).scalars().all() == ["user-1"]
        upgrade_to_head(engine)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM device_streams")).scalar() == 0
            assert conn.execute(text("SELECT version FROM fleet_counter")).scalar() == 0
    finally:
        engine.dispose()


def test_round_groups_migration_upgrades_and_downgrades(sql_url: str) -> None:
    """0008 adds the tables of rounds in groups to a database of 0007 (its
    rounds kept) and its downgrade drops them again, rows and all, leaving
    the rest as it was."""
    engine = create_store_engine(sql_url)
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "0007_replica_streams")
            conn.execute(text(
                "INSERT INTO rounds (number, state, started_at, cohort_size, survivors, dropouts, timings, metrics)"
                " VALUES (3, 'committed', '2025-01-01 00:00:00', 3, '{}', '{}', '{}', '{}')"))
        assert set(inspect(engine).get_table_names()) == TABLES - GROUP_TABLES - SECRET_TABLES
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "0008_round_groups")
        store = open_store(sql_url, migrate=False)
        try:
            leader = store.acquire_lease("leader", 30.0)
            member = store.join_tier("replica-a", 30.0, settings_digest="")
            assert leader is not None and member is not None
            n = store.next_round_number()
            assert n == 4
            start = datetime(2025, 1, 2, tzinfo=UTC)
            store.open_planned_round(
                RoundRecord(number=n, state=RoundState.TRAINING, started_at=start, cohort_size=2),
                RoundPlan(round_number=n, lease_token=leader.token, nonce=b"n", model_name="m", model_version=1,
                          step=0, hyperparameters={}, metric_names=(), cohort_size=2, minimum=2, rotation_key=b"k",
                          deadlines={}, task_deadlines={}, opened_at=start, closes_at=start),
                [GroupAssignment(round_number=n, index=0, replica="replica-a", replica_token=member.token,
                                 members=(1, 2), secagg_settings=b"s", session_id=b"i")], fence=leader)
            assert [g.state for g in store.round_groups(n)] == [GroupState.ASSIGNED]
        finally:
            store.close()
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0007_replica_streams")
        assert set(inspect(engine).get_table_names()) == TABLES - GROUP_TABLES - SECRET_TABLES
        assert current_revision(engine) == "0007_replica_streams"
        with engine.connect() as conn:
            assert conn.execute(text("SELECT number FROM rounds ORDER BY number")).scalars().all() == [3, 4]
        upgrade_to_head(engine)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM round_groups")).scalar() == 0
    finally:
        engine.dispose()


def test_tier_secret_migration_upgrades_and_downgrades(sql_url: str) -> None:
    """0009 adds the one-row tier secret, 32 random bytes drawn at upgrade
    (so two databases differ), to a database of 0008 (its devices kept);
    its downgrade drops it, leaving the rest as it was, and the next
    upgrade draws a new one."""
    engine = create_store_engine(sql_url)
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "0008_round_groups")
            conn.execute(text("INSERT INTO devices (local_id, identity_public_key, enrolled_at, status)"
                              " VALUES ('user-1', :key, '2025-01-01 00:00:00', 'active')"), {"key": b"A" * 32})
        assert set(inspect(engine).get_table_names()) == TABLES - SECRET_TABLES
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "0009_tier_secret")
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT id, secret FROM tier_secret")).all()
        assert [r[0] for r in rows] == [1] and len(bytes(rows[0][1])) == 32
        first = bytes(rows[0][1])
        store = open_store(sql_url, migrate=False)
        try:
            assert store.tier_secret() == first
        finally:
            store.close()
        with engine.begin() as conn, pytest.raises(IntegrityError):
            conn.execute(text("INSERT INTO tier_secret (id, secret) VALUES (2, :s)"), {"s": b"x" * 32})
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0008_round_groups")
        assert set(inspect(engine).get_table_names()) == TABLES - SECRET_TABLES
        assert current_revision(engine) == "0008_round_groups"
        with engine.connect() as conn:
            assert conn.execute(text("SELECT local_id FROM devices")).scalars().all() == ["user-1"]
        upgrade_to_head(engine)
        with engine.connect() as conn:
            again = bytes(conn.execute(text("SELECT secret FROM tier_secret")).scalar_one())
        assert len(again) == 32 and again != first
    finally:
        engine.dispose()


def test_foreign_keys_are_enforced(sql_url: str) -> None:
    engine = create_store_engine(sql_url)
    try:
        upgrade_to_head(engine)
        row = dict(round_number=42, epsilon=1.0, delta=1e-5, noise_multiplier=1.0, sampling_rate=0.1,
                   cumulative_epsilon=1.0)
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.execute(insert(PrivacyLedgerRow), row)
    finally:
        engine.dispose()


def test_sqlite_file_uses_wal_and_foreign_keys(tmp_path: Path) -> None:
    engine = create_store_engine(f"sqlite:///{tmp_path}/sub/dir/f.db")  # parent dirs are created
    try:
        with engine.connect() as conn:
            assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
    finally:
        engine.dispose()


def test_sqlite_memory_url_works() -> None:
    store = open_store("sqlite://")
    try:
        d, new = store.enroll_device(b"z" * 32)
        assert new and store.get_device(d.id) == d
    finally:
        store.close()


@pytest.mark.parametrize(
    ("url", "driver"),
    [("postgresql://u@h:5/db", "postgresql+psycopg"), ("postgres://u@h/db", "postgresql+psycopg"),
     ("sqlite:///x.db", "sqlite"), ("postgresql+psycopg://u@h/db", "postgresql+psycopg")],
)
def test_url_normalization(url: str, driver: str) -> None:
    assert normalize_url(url).drivername == driver


@pytest.mark.parametrize("url", ["mysql://u@h/db", "postgresql+asyncpg://u@h/db", "not a url"])
def test_unsupported_urls_are_refused_clearly(url: str) -> None:
    with pytest.raises(StoreError, match="database URL"):
        open_store(url)


def test_unreachable_postgresql_raises_store_error() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    with pytest.raises(StoreError, match="cannot migrate"):
        open_store(f"postgresql+psycopg://nobody@127.0.0.1:{port}/nothing?connect_timeout=2")


# ------------------------------------------------------------------- blobs
def test_parameter_blobs_are_deterministic_float32_npz() -> None:
    params: dict[str, np.ndarray] = {
        "item_embedding": np.arange(12, dtype=np.float64).reshape(4, 3),
        "bias": np.ones(4, np.float32),
        "ids": np.arange(3, dtype=np.int64),
    }
    blob = pack_parameters(params)
    assert blob == pack_parameters(dict(reversed(list(params.items()))))
    back = unpack_parameters(blob)
    assert set(back) == set(params)
    assert back["item_embedding"].dtype == np.float32 and back["ids"].dtype == np.int64
    np.testing.assert_array_equal(back["item_embedding"], params["item_embedding"].astype(np.float32))


def test_object_arrays_are_never_pickled() -> None:
    with pytest.raises(ValueError):
        pack_parameters({"x": np.array([object()], dtype=object)})
    with pytest.raises(ValueError):
        pack_parameters({"a/b": np.zeros(1)})


@pytest.mark.parametrize("sql_url", ["postgresql"], indirect=True)  # SQLite serves one coordinator (D90)
def test_replicas_starting_together_migrate_once(sql_url: str) -> None:
    """Three coordinator replicas upgrading one empty PostgreSQL database at
    once: all succeed (they wait for each other on an advisory lock) and the
    schema is at head."""
    import threading

    engines = [create_store_engine(sql_url) for _ in range(3)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(engines))

    def upgrade(engine: Any) -> None:
        start.wait()
        try:
            upgrade_to_head(engine)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=upgrade, args=(e,)) for e in engines]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert current_revision(engines[0]) == head_revision()
    finally:
        for e in engines:
            e.dispose()
