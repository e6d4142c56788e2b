"""Fixtures of the process-level integration tests (tests/integration).

  procs         a `Processes` launcher in the test's temp dir; every process
                it started is stopped (SIGTERM, then SIGKILL of its process
                group) at teardown, also when the test fails or times out
  database_url  parametrize indirectly with "sqlite" / "postgresql": a fresh
                SQLite file, or a fresh database on the throwaway PostgreSQL
                server of tests/conftest_pg.py (a plugin of tests/conftest.py)
  balanced      HAProxy in front of the active tier's three replicas
                (active_tier.tier_balancer): (balancer, replicas, front address)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from integration_harness import Processes

if TYPE_CHECKING:
    from fedmask.bench.balancer import Balancer, Replica


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


@pytest.fixture
def balanced(tmp_path: Path) -> Iterator[tuple[Balancer, list[Replica], str]]:
    from active_tier import tier_balancer  # HAProxy's tests alone need it

    with tier_balancer(tmp_path) as tier:
        yield tier
