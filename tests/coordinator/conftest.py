"""Fixtures of the coordinator tests: the throwaway PostgreSQL server (from
tests/conftest_pg.py) and a `backend` fixture giving a fresh, migrated
store of each implementation: memory, sqlite (a WAL file), postgresql."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine

from coordinator.store import InMemoryStore, Store, open_store
from coordinator.store.sql import SqlStore


def _load_pg_plugin():  # type: ignore[no-untyped-def]
    name = "fedmask_tests_conftest_pg"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "conftest_pg.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


_pg = _load_pg_plugin()
postgresql_server = _pg.postgresql_server
postgresql_url = _pg.postgresql_url

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
