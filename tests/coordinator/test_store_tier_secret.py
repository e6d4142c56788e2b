"""The Store contract for the tier's secret (`Store.tier_secret`,
coordinator/store/replica_interface.py; migration 0009) on every backend,
and, on PostgreSQL, that the admin service's read-only role cannot read it."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import create_engine, text
from sqlalchemy.exc import ProgrammingError

from coordinator.store import InMemoryStore, NotFoundError, Store, open_store
from coordinator.store.engine import create_store_engine
from coordinator.store.migrate import alembic_config, upgrade_to_head

Backend = Any  # the `backend` fixture of conftest.py
REPO = Path(__file__).resolve().parents[2]


@contextmanager
def another_database(backend: Backend, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A store on a second, fresh database of `backend`'s kind."""
    if backend.name == "memory":
        yield InMemoryStore()
        return
    if backend.name == "sqlite":
        store = open_store(f"sqlite:///{tmp_path / 'other.db'}")
        try:
            yield store
        finally:
            store.close()
        return
    from conftest_pg import _admin

    server = request.getfixturevalue("postgresql_server")
    name = f"fedmask_test_{uuid.uuid4().hex[:12]}"
    _admin(server, "CREATE DATABASE {}", name)
    store = open_store(server.url(name))
    try:
        yield store
    finally:
        store.close()
        _admin(server, "DROP DATABASE IF EXISTS {} WITH (FORCE)", name)


def test_the_secret_is_32_bytes_stable_per_database_and_differs_between_databases(
        backend: Backend, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    secret = backend.store.tier_secret()
    assert isinstance(secret, bytes) and len(secret) == 32
    assert secret != bytes(32)
    assert backend.store.tier_secret() == secret
    if backend.url is not None:  # another store object on the same database: another replica
        again = open_store(backend.url)
        try:
            assert again.tier_secret() == secret
        finally:
            again.close()
    with another_database(backend, request, tmp_path) as other:
        assert len(other.tier_secret()) == 32
        assert other.tier_secret() != secret


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)
def test_a_missing_secret_row_is_not_found(backend: Backend) -> None:
    with backend.engine.begin() as conn:
        conn.execute(text("DELETE FROM tier_secret"))
    with pytest.raises(NotFoundError, match="tier_secret"):
        backend.store.tier_secret()


def test_the_read_only_role_cannot_read_the_tier_secret(postgresql_url: str, postgresql_server: Any,
                                                        tmp_path: Path) -> None:
    """deploy/postgres/initdb/10-fedmask-reader.sh run on a database already
    at head (the script revokes), then a downgrade to 0008 and upgrade (the
    migration revokes, the role existing): fedmask_reader reads the rounds
    but never `tier_secret`, and the owner reads the (new) secret."""
    database = postgresql_url.rsplit("/", 1)[1]
    password = tmp_path / "reader-password"
    password.write_text("reader")
    env = {**os.environ, "FEDMASK_READER_PASSWORD_FILE": str(password), "POSTGRES_USER": postgresql_server.user,
           "POSTGRES_DB": database, "PGHOST": postgresql_server.host, "PGPORT": str(postgresql_server.port)}
    reader_url = postgresql_url.replace(f"//{postgresql_server.user}@", "//fedmask_reader@")
    engine = create_store_engine(postgresql_url)
    upgrade_to_head(engine)
    subprocess.run(["bash", str(REPO / "deploy/postgres/initdb/10-fedmask-reader.sh")], env=env, check=True,
                   capture_output=True, timeout=60)
    reader = create_engine(reader_url)
    secrets: list[bytes] = []
    try:
        for _ in range(2):
            with engine.connect() as conn:
                secrets.append(bytes(conn.execute(text("SELECT secret FROM tier_secret")).scalar_one()))
            with reader.connect() as conn:
                assert conn.execute(text("SELECT count(*) FROM rounds")).scalar() == 0
                with pytest.raises(ProgrammingError, match="permission denied"):
                    conn.execute(text("SELECT secret FROM tier_secret"))
            with engine.begin() as conn:
                command.downgrade(alembic_config(conn), "0008_round_groups")
            upgrade_to_head(engine)
        assert len(secrets[0]) == 32 and secrets[1] != secrets[0]  # a new upgrade draws a new secret
    finally:
        reader.dispose()
        with engine.begin() as conn:
            conn.execute(text("DROP OWNED BY fedmask_reader"))
        engine.dispose()
        subprocess.run(["psql", "-h", postgresql_server.host, "-p", str(postgresql_server.port), "-U",
                        postgresql_server.user, "-d", "postgres", "-c", "DROP ROLE IF EXISTS fedmask_reader"],
                       check=False, capture_output=True, timeout=60)
