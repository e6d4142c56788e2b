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


def create_store_engine(url: str | URL, **kwargs: Any) -> Engine:
    """An Engine configured for the store (see module docstring)."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed, **kwargs)
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
