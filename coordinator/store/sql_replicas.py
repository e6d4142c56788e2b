"""The replica tier on SQL: membership rows (`replicas`), stream ownership
(`device_streams`) and the fleet counter (`fleet_counter`), migration 0007;
the tier's secret (`tier_secret`), migration 0009.
A mixin of `SqlStore` (coordinator/store/sql.py); the contracts, and the
order in which writers lock rows, are those of
coordinator/store/replica_interface.py.

Every expiry is computed by the database (`database_now`), as for the
leader lease. A publish is fenced by its replica's membership row, read
FOR UPDATE (not FOR SHARE as the leader fence: the publish writes the
row's `streams_version`) in the same transaction as its writes, so a join
that starts a new term of that name waits for it, and a publish after that
join sees the new token. Rows are created with INSERT ... ON CONFLICT
(PostgreSQL and SQLite), so concurrent first joins or claims of one key
never fail on the unique key.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sqlalchemy import CursorResult, delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from coordinator.store.errors import NotFoundError
from coordinator.store.lease_records import FencedOut, Lease
from coordinator.store.orm import DeviceRow, DeviceStreamRow, FleetCounterRow, ReplicaRow, TierSecretRow
from coordinator.store.replica_records import (
    PublishPlan,
    ReplicaRecord,
    StreamClaim,
    StreamOwner,
    StreamRow,
    StreamSync,
    check_join_request,
    check_publish,
    next_member_row,
    plan_publish,
)
from coordinator.store.sql_lease import database_now

T = TypeVar("T")
#: Rows per statement: far below the bound-parameter limits of PostgreSQL
#: (65535) and SQLite (32766), with 7 parameters per claimed row.
_CHUNK = 1000


def _insert(session: Session) -> Callable[[Any], Any]:
    """The dialect's INSERT, which has ON CONFLICT."""
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql.insert
    if dialect == "sqlite":
        return sqlite.insert
    raise ValueError(f"no upsert for the {dialect} dialect")


def _member_row(session: Session, name: str) -> ReplicaRow | None:
    query = select(ReplicaRow).where(ReplicaRow.name == name).with_for_update()
    return session.scalars(query.execution_options(populate_existing=True)).first()


def _counter(session: Session) -> FleetCounterRow:
    return session.get_one(FleetCounterRow, FleetCounterRow.COUNTER_ID, with_for_update=True)


def _bump(session: Session) -> int:
    counter = _counter(session)
    counter.version += 1
    return counter.version


def _live_term() -> Any:
    """The join of a stream row with its replica's row when the row's term
    is that replica's current term (the caller adds the expiry)."""
    return (ReplicaRow.name == DeviceStreamRow.replica) & (ReplicaRow.token == DeviceStreamRow.replica_token)


class SqlReplicas:
    """Replica membership and stream ownership on SQL (see the module doc)."""

    if TYPE_CHECKING:  # provided by SqlStore
        def _read(self, body: Callable[[Session], T]) -> T: ...
        def _write(self, body: Callable[[Session], T], *, retry_unique: bool = False) -> T: ...

    def join_tier(self, replica: str, seconds: float, *, settings_digest: str, device_address: str | None = None,
                  admin_address: str | None = None, renewing: Lease | None = None) -> Lease | None:
        check_join_request(replica, seconds, settings_digest, device_address, admin_address, renewing)

        def body(s: Session) -> Lease | None:
            now = database_now(s)
            s.execute(_insert(s)(ReplicaRow).values(
                name=replica, token=0, expires_at=0.0, joined_at=0.0, settings_digest="", streams_version=0,
            ).on_conflict_do_nothing(index_elements=[ReplicaRow.name]))
            row = _member_row(s, replica)
            assert row is not None  # inserted above, or already there
            after = next_member_row(row.token, row.expires_at, renewing, seconds, now)
            if after is None:
                return None
            if after.token != row.token:  # a new term
                row.token, row.joined_at = after.token, now
                _bump(s)
            row.expires_at = after.expires_at
            row.settings_digest, row.device_address, row.admin_address = settings_digest, device_address, admin_address
            return Lease(replica, after.token, seconds)

        return self._write(body)

    def leave_tier(self, lease: Lease) -> None:
        def body(s: Session) -> None:
            row = _member_row(s, lease.holder)
            if row is None or row.token != lease.token:
                return
            ran = row.expires_at > database_now(s)
            counter = _counter(s)  # before the stream rows: the lock order of every writer
            row.expires_at = 0.0
            gone = s.execute(delete(DeviceStreamRow).where(DeviceStreamRow.replica == lease.holder,
                                                           DeviceStreamRow.replica_token == lease.token))
            if ran or cast(CursorResult[Any], gone).rowcount:
                counter.version += 1

        self._write(body)

    def live_replicas(self) -> list[ReplicaRecord]:
        def body(s: Session) -> list[ReplicaRecord]:
            query = select(ReplicaRow).where(ReplicaRow.expires_at > database_now(s)).order_by(ReplicaRow.name)
            return [ReplicaRecord(r.name, r.token, r.expires_at, r.joined_at, r.settings_digest, r.device_address,
                                  r.admin_address, r.streams_version) for r in s.scalars(query)]

        return self._read(body)

    def publish_streams(self, member: Lease, *, claims: Sequence[StreamClaim] = (),
                        availability: Mapping[int, bool] | None = None, released: Iterable[int] = ()) -> StreamSync:
        request = check_publish(claims, availability or {}, released)

        def body(s: Session) -> StreamSync:
            now = database_now(s)
            row = _member_row(s, member.holder)
            if row is None or row.token != member.token or row.expires_at <= now:
                current = "none" if row is None else f"{row.token}, expires {row.expires_at - now:+.3f} s from now"
                raise FencedOut(f"{member.holder} is not a member under token {member.token} (the row: {current})")
            counter = _counter(s)  # serialises publishes (see replica_interface)
            claimed = sorted({c.device_id for c in request.claims})
            enrolled = {d for part in _chunks(claimed) for d in s.scalars(select(DeviceRow.id).where(
                DeviceRow.id.in_(part)))}
            if missing := [d for d in claimed if d not in enrolled]:
                raise NotFoundError(f"devices {missing} are not enrolled")
            stored = {r.device_id: StreamRow(r.replica, r.replica_token, r.session_key, r.available)
                      for part in _chunks(request.devices)
                      for r in s.scalars(select(DeviceStreamRow).where(DeviceStreamRow.device_id.in_(part)))}
            plan = plan_publish(member, request, stored)
            if plan.changes:
                counter.version += 1
                row.streams_version = counter.version
                _apply(s, member, plan, counter.version, now)
            return StreamSync(plan.displaced)

        return self._write(body)

    def stream_owner(self, device_id: int) -> StreamOwner | None:
        def body(s: Session) -> StreamOwner | None:
            query = (select(DeviceStreamRow.replica, DeviceStreamRow.session_key, DeviceStreamRow.available)
                     .join(ReplicaRow, _live_term())
                     .where(DeviceStreamRow.device_id == device_id, ReplicaRow.expires_at > database_now(s)))
            found = s.execute(query).first()
            return None if found is None else StreamOwner(found[0], int(found[1]), bool(found[2]))

        return self._read(body)

    def available_by_replica(self) -> dict[str, list[tuple[int, int]]]:
        def body(s: Session) -> dict[str, list[tuple[int, int]]]:
            query = (select(DeviceStreamRow.replica, DeviceStreamRow.device_id, DeviceStreamRow.session_key)
                     .join(ReplicaRow, _live_term())
                     .where(DeviceStreamRow.available.is_(True), ReplicaRow.expires_at > database_now(s))
                     .order_by(DeviceStreamRow.replica, DeviceStreamRow.device_id))
            out: defaultdict[str, list[tuple[int, int]]] = defaultdict(list)
            for replica, device_id, session_key in s.execute(query):
                out[replica].append((int(device_id), int(session_key)))
            return dict(out)

        return self._read(body)

    def stream_counts(self) -> dict[str, tuple[int, int]]:
        def body(s: Session) -> dict[str, tuple[int, int]]:
            now = database_now(s)
            out = {name: (0, 0) for name in s.scalars(select(ReplicaRow.name).where(ReplicaRow.expires_at > now)
                                                       .order_by(ReplicaRow.name))}
            query = (select(DeviceStreamRow.replica, func.count(),
                            func.count().filter(DeviceStreamRow.available.is_(True)))
                     .join(ReplicaRow, _live_term()).where(ReplicaRow.expires_at > now)
                     .group_by(DeviceStreamRow.replica))
            for replica, held, available in s.execute(query):
                out[replica] = (int(held), int(available))
            return out

        return self._read(body)

    def fleet_version(self) -> int:
        query = select(FleetCounterRow.version).where(FleetCounterRow.id == FleetCounterRow.COUNTER_ID)
        return self._read(lambda s: int(s.execute(query).scalar_one()))

    def tier_secret(self) -> bytes:
        query = select(TierSecretRow.secret).where(TierSecretRow.id == TierSecretRow.SECRET_ID)
        found = self._read(lambda s: s.execute(query).scalar_one_or_none())
        if found is None:
            raise NotFoundError("the tier_secret row is missing (migration 0009 draws it)")
        return bytes(found)


def _chunks(ids: Sequence[T]) -> Iterator[Sequence[T]]:
    """`ids` in slices of at most `_CHUNK` (one statement's bound parameters each)."""
    return (ids[i:i + _CHUNK] for i in range(0, len(ids), _CHUNK))


def _apply(s: Session, member: Lease, plan: PublishPlan, version: int, now: float) -> None:
    """Write `plan` (by ascending device ids within each kind of write; the
    fleet counter, already locked, serialises publishes)."""
    for claims in _chunks(plan.claims):
        stmt = _insert(s)(DeviceStreamRow).values([
            dict(device_id=c.device_id, replica=member.holder, replica_token=member.token,
                 session_key=c.session_key, available=c.available, claim=version, updated_at=now)
            for c in claims])
        s.execute(stmt.on_conflict_do_update(index_elements=[DeviceStreamRow.device_id], set_={
            name: stmt.excluded[name]
            for name in ("replica", "replica_token", "session_key", "available", "claim", "updated_at")}))
    for value in (False, True):
        # the plan only lists rows of this term; the WHERE says so again
        for chosen in _chunks(sorted(d for d, v in plan.availability.items() if v is value)):
            s.execute(update(DeviceStreamRow).where(
                DeviceStreamRow.device_id.in_(chosen), DeviceStreamRow.replica == member.holder,
                DeviceStreamRow.replica_token == member.token).values(available=value, updated_at=now))
    for part in _chunks(sorted(plan.released)):
        s.execute(delete(DeviceStreamRow).where(DeviceStreamRow.device_id.in_(part),
                                                DeviceStreamRow.replica == member.holder))
