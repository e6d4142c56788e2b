"""Fixtures of the coordinator tests: a `backend` fixture giving a fresh,
migrated store of each implementation: memory, sqlite (a WAL file),
postgresql (on the throwaway server of tests/conftest_pg.py, a plugin of
tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine

from coordinator.store import InMemoryStore, Store, open_store
from coordinator.store.sql import SqlStore

BACKENDS = ["memory", "sqlite", "postgresql"]
SQL_BACKENDS = ["sqlite", "postgresql"]


@dataclass
class Backend:
    name: str
    store: Store
    #: The database URL (None for memory).
    url: str | None

    @property
    def engine(self) -> Engine:
        assert isinstance(self.store, SqlStore), "no engine for the memory store"
        return self.store.engine


def database_url(request: pytest.FixtureRequest, name: str, tmp_path: Path) -> str:
    if name == "sqlite":
        return f"sqlite:///{tmp_path / 'fedmask.db'}"
    if name == "postgresql":
        return str(request.getfixturevalue("postgresql_url"))
    raise ValueError(name)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "memory":
        yield Backend("memory", InMemoryStore(), None)
        return
    url = database_url(request, request.param, tmp_path)
    store = open_store(url)
    try:
        yield Backend(request.param, store, url)
    finally:
        store.close()


@pytest.fixture(params=SQL_BACKENDS)
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL of an empty database of each SQL backend (not migrated)."""
    return database_url(request, request.param, tmp_path)
