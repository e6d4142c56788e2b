"""Engine creation for the SQL store: URL checks and per-backend settings.

Supported URLs:
  sqlite:///relative/or/absolute/path.db   (file; WAL, foreign keys, busy timeout)
  sqlite://  or  sqlite:///:memory:        (one shared in-memory connection)
  postgresql+psycopg://user@host:port/db   (psycopg 3; plain postgresql:// is
                                            mapped to it)

SQLite transactions: the pysqlite driver's implicit transaction handling is
switched off and every SQLAlchemy transaction emits its own BEGIN (the
recipe of the SQLAlchemy docs), so reads and writes of one unit of work are
really in one transaction and DDL in migrations is transactional. The BEGIN
is `BEGIN IMMEDIATE` (take the write lock now, waiting up to the busy
timeout for another writer) unless the connection's execution options say
`{SQLITE_BEGIN_OPTION: "DEFERRED"}` (read-only transactions; see
coordinator.store.transactions): a transaction that may write must never
begin deferred, or in WAL mode it fails at once with "database is locked"
when another writer committed after its first read.

PostgreSQL transactions of a process that stops between statements (a
SIGSTOP, a frozen VM, a hung host) keep their row locks while the server
keeps the session; a stopped replica holding the leader lease row or a
round row would then block its successor's every fenced write for as long
as it stays stopped, lease or no lease. With `idle_in_transaction_s` the
server ends such a session after that many seconds idle inside a
transaction, and its locks go with it (`idle_in_transaction_session_timeout`).
The coordinator sets it to half its lease
(`coordinator.replica_settings.transaction_idle_limit`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import StaticPool

from coordinator.store.errors import StoreError
from coordinator.store.transactions import SQLITE_BEGIN_MODES, SQLITE_BEGIN_OPTION

SQLITE_BUSY_TIMEOUT_MS = 10_000


def normalize_url(url: str | URL) -> URL:
    """Parse and check a database URL; raises StoreError with the reason."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise StoreError(f"invalid database URL {str(url)!r}: {exc}") from None
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.drivername not in ("sqlite", "sqlite+pysqlite", "postgresql+psycopg"):
        raise StoreError(
            f"unsupported database URL scheme {parsed.drivername!r}: use sqlite:///FILE "
            "or postgresql+psycopg://USER@HOST:PORT/DB"
        )
    return parsed


def is_sqlite_memory(url: URL) -> bool:
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")


def create_store_engine(url: str | URL, *, idle_in_transaction_s: float | None = None, **kwargs: Any) -> Engine:
    """An Engine configured for the store (see module docstring);
    `idle_in_transaction_s` applies to PostgreSQL alone."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed, **kwargs)
    if idle_in_transaction_s is not None:
        if not idle_in_transaction_s > 0:
            raise ValueError(f"idle_in_transaction_s must be > 0, got {idle_in_transaction_s!r}")
        ms = max(1, round(idle_in_transaction_s * 1000))
        kwargs["connect_args"] = {**kwargs.get("connect_args", {}),
                                  "options": f"-c idle_in_transaction_session_timeout={ms}"}
    return create_engine(parsed, pool_pre_ping=True, **kwargs)


def _sqlite_engine(url: URL, **kwargs: Any) -> Engine:
    memory = is_sqlite_memory(url)
    if memory:
        kwargs.setdefault("poolclass", StaticPool)
    else:
        Path(url.database or "").expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"check_same_thread": False}, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # autocommit: we emit BEGIN ourselves
        cursor = dbapi_connection.cursor()
        try:
            if not memory:
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        mode = connection.get_execution_options().get(SQLITE_BEGIN_OPTION, "IMMEDIATE")
        if mode not in SQLITE_BEGIN_MODES:
            raise StoreError(f"unknown SQLite begin mode {mode!r} (one of {SQLITE_BEGIN_MODES})")
        connection.exec_driver_sql(f"BEGIN {mode}")

    return engine
