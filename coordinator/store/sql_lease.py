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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import func, literal, select
from sqlalchemy.orm import Session

from coordinator.store.lease_records import FencedOut, Lease, LeaseRow, check_lease_request, next_lease_row
from coordinator.store.orm import LeaderLeaseRow

T = TypeVar("T")

_LEASE_ID = 1
_UNIX_EPOCH_JULIAN_DAY = 2440587.5


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
