"""A throwaway PostgreSQL server for tests (a plugin of tests/conftest.py,
so its fixtures serve every test package).

Fixtures:
  postgresql_server  session scope: initdb into a fresh temp dir, start the
                     server on a free 127.0.0.1 port (unix socket in the temp
                     dir, fsync off), stop it and delete everything at the end.
  postgresql_url     function scope: a new empty database on that server;
                     yields its SQLAlchemy URL (postgresql+psycopg://...),
                     drops it afterwards.

The server itself (where its binaries are looked for, initdb and pg_ctl,
running as the `postgres` user when we are root) is
fedmask/bench/throwaway_postgres.py, which `fedmask bench scale` starts
too; `.ci/ensure-postgres` installs postgresql-15 when none is found. The
temp dir is under /tmp, which the `postgres` user can traverse, unlike
pytest's 0700 tmp dirs.

When the server cannot be started the fixture FAILS under CI (env CI set to
anything but "", "0", "false", "no") and skips with the reason otherwise.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedmask.bench.throwaway_postgres import (
    PG_PREFERRED_MAJOR,
    PgServer,
    PgUnavailable,
    RunningServer,
    admin,
    find_pg_bindir,
    start_server,
)

__all__ = ["PG_PREFERRED_MAJOR", "PgServer", "PgUnavailable", "find_pg_bindir", "in_ci"]

#: The superuser statement helper (tests/admin/admin_harness.py imports it from here).
_admin = admin


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _unavailable(reason: str) -> None:
    message = f"PostgreSQL test server unavailable: {reason}"
    if in_ci():
        pytest.fail(message + "\n(CI is set: the PostgreSQL tests must run; see .ci/ensure-postgres)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def postgresql_server() -> Iterator[PgServer]:
    bindir = find_pg_bindir()
    if bindir is None:
        _unavailable("no initdb/pg_ctl/postgres found (run .ci/ensure-postgres or set FEDMASK_PG_BINDIR)")
        return
    base = Path(tempfile.mkdtemp(prefix="fedmask-pg-", dir="/tmp"))
    started: RunningServer | None = None
    try:
        try:
            started = start_server(base, bindir)
            _admin(started.server, "SELECT 1")
        except (PgUnavailable, OSError, subprocess.SubprocessError) as exc:
            _unavailable(str(exc))
        assert started is not None
        yield started.server
    finally:
        if started is not None:
            started.stop()
        shutil.rmtree(base, ignore_errors=True)


_DB_NAME = re.compile(r"^[a-z0-9_]+$")


@pytest.fixture
def postgresql_url(postgresql_server: PgServer) -> Iterator[str]:
    name = f"fedmask_test_{uuid.uuid4().hex[:12]}"
    assert _DB_NAME.match(name)
    _admin(postgresql_server, "CREATE DATABASE {}", name)
    try:
        yield postgresql_server.url(name)
    finally:
        _admin(postgresql_server, "DROP DATABASE IF EXISTS {} WITH (FORCE)", name)
