"""Fixtures of the process-level integration tests (tests/integration).

  procs         a `Processes` launcher in the test's temp dir; every process
                it started is stopped (SIGTERM, then SIGKILL of its process
                group) at teardown, also when the test fails or times out
  database_url  parametrize indirectly with "sqlite" / "postgresql": a fresh
                SQLite file, or a fresh database on the throwaway PostgreSQL
                server of tests/conftest_pg.py (a plugin of tests/conftest.py)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from integration_harness import Processes


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    p = Processes(tmp_path)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    backend = getattr(request, "param", "sqlite")
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'coordinator.db'}"
    if backend == "postgresql":
        return str(request.getfixturevalue("postgresql_url"))
    raise ValueError(backend)
