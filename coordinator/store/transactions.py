"""How the SQL store's transactions begin on each backend, and which
database errors mean "rolled back because of concurrency, run it again".

Two kinds of transaction (decision D23 of docs/decisions.md):

  READ   only reads.
         SQLite: BEGIN DEFERRED (a WAL snapshot; never waits for writers).
         PostgreSQL: READ COMMITTED, READ ONLY (each method reads with one
         statement, so a per-statement snapshot is consistent).
  WRITE  reads and writes.
         SQLite: BEGIN IMMEDIATE: the write lock is taken up front, so a
         concurrent writer makes it WAIT (busy timeout) instead of failing
         at its first write with "database is locked" (SQLITE_BUSY), which
         is what a deferred transaction that read first does in WAL mode.
         PostgreSQL: READ COMMITTED, with explicit row locks where a write
         depends on a read (SELECT ... FOR UPDATE of the round row and of
         the round-number counter; the unique key of devices). Deadlocks
         (40P01) and serialization failures (40001) are retried.

`is_transient` and `is_unique_violation` classify SQLAlchemy exceptions by
the driver's SQLSTATE (psycopg) or extended result code (sqlite3).
"""

from __future__ import annotations

import sqlite3
from enum import Enum
from typing import Any

from sqlalchemy.exc import DBAPIError

#: Execution option read by the SQLite "begin" hook (coordinator.store.engine).
SQLITE_BEGIN_OPTION = "fedmask_sqlite_begin"
SQLITE_BEGIN_MODES = ("DEFERRED", "IMMEDIATE")

# PostgreSQL SQLSTATEs (Appendix A of the PostgreSQL manual).
SERIALIZATION_FAILURE = "40001"
DEADLOCK_DETECTED = "40P01"
UNIQUE_VIOLATION = "23505"
_TRANSIENT_SQLSTATES = frozenset({SERIALIZATION_FAILURE, DEADLOCK_DETECTED})

# sqlite3 extended result code of a UNIQUE / PRIMARY KEY constraint failure.
_SQLITE_CONSTRAINT_UNIQUE = getattr(sqlite3, "SQLITE_CONSTRAINT_UNIQUE", 2067)
_SQLITE_CONSTRAINT_PRIMARYKEY = getattr(sqlite3, "SQLITE_CONSTRAINT_PRIMARYKEY", 1555)


class TxKind(Enum):
    READ = "read"
    WRITE = "write"


def execution_options(backend: str, kind: TxKind) -> dict[str, Any]:
    """SQLAlchemy execution options of an Engine whose sessions run `kind`
    transactions on `backend` ("sqlite" or "postgresql")."""
    if backend == "sqlite":
        return {SQLITE_BEGIN_OPTION: "DEFERRED" if kind is TxKind.READ else "IMMEDIATE"}
    if backend == "postgresql":
        return {"isolation_level": "READ COMMITTED", "postgresql_readonly": kind is TxKind.READ}
    raise ValueError(f"unsupported backend {backend!r}")


def _sqlstate(exc: BaseException) -> str | None:
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    state = getattr(orig, "sqlstate", None)
    return state if isinstance(state, str) else None


def is_transient(exc: BaseException) -> bool:
    """The database rolled the transaction back because of a concurrent one
    (PostgreSQL deadlock or serialization failure): running it again from
    the start is safe and may succeed. SQLite never reports these: its
    writers wait for the lock (BEGIN IMMEDIATE + busy timeout)."""
    return _sqlstate(exc) in _TRANSIENT_SQLSTATES


def is_unique_violation(exc: BaseException) -> bool:
    """A UNIQUE or PRIMARY KEY constraint refused an insert."""
    if _sqlstate(exc) == UNIQUE_VIOLATION:
        return True
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    code = getattr(orig, "sqlite_errorcode", None)
    return code in (_SQLITE_CONSTRAINT_UNIQUE, _SQLITE_CONSTRAINT_PRIMARYKEY)
