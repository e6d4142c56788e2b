"""The leader lease on SQL (D90): one row of the `leader_lease` table
(migration 0005). A mixin of `SqlStore` (coordinator/store/sql.py); the
contracts are those of coordinator/store/interface.py.

Every expiry is computed by the database (`now()` on PostgreSQL,
`julianday('now')` on SQLite) and stored as seconds since the epoch, so
replicas never compare their own clocks. The row is read FOR UPDATE by a
takeover or renewal, and FOR SHARE by a fenced write: on PostgreSQL a
takeover therefore waits for a fenced commit in flight and the commit
sees the token as it is when it writes; SQLite serialises all writers
(BEGIN IMMEDIATE), and serves one replica anyway.

A replica stopped inside a transaction (SIGSTOP, a frozen VM) keeps its
session and the lease row's lock, and PostgreSQL's own
`idle_in_transaction_session_timeout` (coordinator/store/engine.py) was
seen not to end every such session: its successor's takeover would wait
for as long as the stopped replica sleeps. So on PostgreSQL a takeover of
an expired lease waits for the row at most `LOCK_WAIT_S`; when that runs
out, it ends the sessions that hold a lock on the lease table and have
been idle inside a transaction for more than `stuck_after_s` (a live
replica never is: its transactions are short), and reports "not taken"
so that the candidate tries again at its next poll. A renewal (the
requester holds the lease) waits as before, and a lease that still runs
is refused without waiting for its row.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import func, literal, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from coordinator.store.lease_records import FencedOut, Lease, LeaseRow, check_lease_request, next_lease_row
from coordinator.store.orm import LeaderLeaseRow

T = TypeVar("T")

_LEASE_ID = 1
_UNIX_EPOCH_JULIAN_DAY = 2440587.5
#: Seconds a takeover of an expired lease waits for the row's lock (PostgreSQL).
LOCK_WAIT_S = 1.0
#: Seconds idle inside a transaction after which a session holding the lease
#: table's locks counts as stuck (its process stopped), unless the store was
#: opened with `idle_in_transaction_s`.
STUCK_AFTER_S = 5.0
_LOCK_NOT_AVAILABLE = "55P03"
_log = logging.getLogger("fedmask.coordinator.store")


def database_now(session: Session) -> float:
    """The database's clock, in seconds since the epoch."""
    dialect = session.get_bind().dialect.name
    expr: Any
    if dialect == "postgresql":
        expr = func.extract("epoch", func.now())
    elif dialect == "sqlite":
        expr = (func.julianday("now") - literal(_UNIX_EPOCH_JULIAN_DAY)) * literal(86400.0)
    else:
        raise ValueError(f"no clock for the {dialect} dialect")
    return float(session.execute(select(expr)).scalar_one())


def _lease_row(session: Session, *, share: bool) -> LeaderLeaseRow:
    query = select(LeaderLeaseRow).where(LeaderLeaseRow.id == _LEASE_ID).with_for_update(read=share)
    return session.scalars(query).one()


def _takeover_row(session: Session, holder: str, stuck_after_s: float) -> LeaderLeaseRow | None:
    """PostgreSQL: the lease row FOR UPDATE for `holder`, or None when the
    lease runs for another holder or its row stayed locked for LOCK_WAIT_S
    (then stuck sessions are ended: module doc)."""
    current = session.execute(select(LeaderLeaseRow.holder, LeaderLeaseRow.expires_at)
                              .where(LeaderLeaseRow.id == _LEASE_ID)).one()  # no lock: MVCC
    if current.holder == holder:
        return _lease_row(session, share=False)  # a renewal waits for its own replica's fenced writes
    if current.holder is not None and current.expires_at > database_now(session):
        return None  # it runs: nothing to take
    session.execute(text(f"SET LOCAL lock_timeout = '{round(LOCK_WAIT_S * 1000)}ms'"))
    try:
        with session.begin_nested():
            return _lease_row(session, share=False)
    except OperationalError as exc:
        if getattr(exc.orig, "sqlstate", None) != _LOCK_NOT_AVAILABLE:
            raise
    session.execute(text("SET LOCAL lock_timeout = 0"))
    ended = session.execute(text(
        "SELECT a.pid, pg_terminate_backend(a.pid) FROM pg_stat_activity a "
        "WHERE a.pid <> pg_backend_pid() AND a.datname = current_database() "
        "AND a.state IN ('idle in transaction', 'idle in transaction (aborted)') "
        "AND a.state_change < clock_timestamp() - make_interval(secs => :idle) "
        "AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.granted "
        "AND l.relation = 'leader_lease'::regclass)"), {"idle": stuck_after_s}).all()
    if ended:
        _log.warning("ended %d session(s) stopped inside a transaction on the expired leader lease "
                     "(pids %s); the takeover is tried again", len(ended), [row[0] for row in ended])
    return None


def check_fence(session: Session, fence: Lease | None) -> None:
    """Inside a write transaction: raise FencedOut unless `fence` (when
    given) is still the lease's holder and token. The row stays locked
    (FOR SHARE) until the transaction ends."""
    if fence is None:
        return
    row = _lease_row(session, share=True)
    if row.holder != fence.holder or row.token != fence.token:
        raise FencedOut(f"{fence.holder} no longer leads (its token {fence.token}, now {row.token})")


class SqlLeaderLease:
    """The leader lease on SQL (see the module doc)."""

    if TYPE_CHECKING:  # provided by SqlStore
        def _read(self, body: Callable[[Session], T]) -> T: ...
        def _write(self, body: Callable[[Session], T], *, retry_unique: bool = False) -> T: ...

    _default_fence: Callable[[], Lease] | None = None
    #: PostgreSQL: when a session holding the lease table's locks counts as stuck (module doc).
    stuck_after_s: float = STUCK_AFTER_S

    def fence_writes(self, fence: Callable[[], Lease]) -> None:
        self._default_fence = fence

    def _fence_for(self, fence: Lease | None) -> Lease | None:
        """`fence`, or the default fence when none is given."""
        if fence is None and self._default_fence is not None:
            return self._default_fence()
        return fence

    def acquire_lease(self, holder: str, seconds: float) -> Lease | None:
        check_lease_request(holder, seconds)

        def body(s: Session) -> Lease | None:
            if s.get_bind().dialect.name == "postgresql":
                found = _takeover_row(s, holder, self.stuck_after_s)
                if found is None:
                    return None
                row = found
            else:
                row = _lease_row(s, share=False)
            after = next_lease_row(LeaseRow(row.holder, row.token, row.expires_at), holder, seconds, database_now(s))
            if after is None:
                return None
            row.holder, row.token, row.expires_at = holder, after.token, after.expires_at
            return Lease(holder, after.token, seconds)

        return self._write(body)

    def release_lease(self, lease: Lease) -> None:
        def body(s: Session) -> None:
            row = _lease_row(s, share=False)
            if row.holder == lease.holder and row.token == lease.token:
                row.holder = None
                row.expires_at = 0.0

        self._write(body)

    def current_lease(self) -> Lease | None:
        def body(s: Session) -> Lease | None:
            row = s.scalars(select(LeaderLeaseRow).where(LeaderLeaseRow.id == _LEASE_ID)).one()
            remaining = row.expires_at - database_now(s)
            if row.holder is None or remaining <= 0:
                return None
            return Lease(row.holder, row.token, remaining)

        return self._read(body)
