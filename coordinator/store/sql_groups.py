"""Rounds in groups on SQL: `round_plans`, `round_groups` and
`round_group_sums` (migration 0008). A mixin of `SqlStore`
(coordinator/store/sql.py), whose commit_round, abort_round and
mark_interrupted_rounds_aborted call `seal_round` here in their own
transactions; the contracts, and the order in which writers lock rows, are
those of coordinator/store/group_interface.py.

A replica's write reads its membership row FOR SHARE (its concurrent
group writes do not wait on each other; a join renewing or replacing the
term, FOR UPDATE, waits for them), then the round row FOR SHARE, then its
group row FOR UPDATE. The leader's close and the sealing lock the round row
FOR UPDATE (sealing: through `_write_round`), then the group rows in
ascending index. On SQLite every writer holds the database's write lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from coordinator.store.errors import ConflictError, CorruptBlobError, InvalidRecordError, NotFoundError
from coordinator.store.group_records import (
    OPEN_STATES,
    EncodedSum,
    GroupAssignment,
    GroupClosed,
    GroupRow,
    GroupState,
    RoundOutcome,
    RoundPlan,
    check_round_groups,
    check_write,
    lost,
    new_group_row,
    sum_digest,
)
from coordinator.store.group_writes import ReplicaGroupWrites
from coordinator.store.lease_records import FencedOut, Lease
from coordinator.store.orm import ModelVersionRow, ReplicaRow, RoundGroupRow, RoundGroupSumRow, RoundPlanRow, RoundRow
from coordinator.store.records import RoundRecord, RoundState
from coordinator.store.sql_lease import check_fence, database_now

T = TypeVar("T")
_TERMINAL = (RoundState.COMMITTED.value, RoundState.ABORTED.value)


class SqlRoundGroups(ReplicaGroupWrites):
    """Round plans, group rows and group sums on SQL (see the module doc)."""

    if TYPE_CHECKING:  # provided by SqlStore
        def _read(self, body: Callable[[Session], T]) -> T: ...
        def _write(self, body: Callable[[Session], T], *, retry_unique: bool = False) -> T: ...
        def _fence_for(self, fence: Lease | None) -> Lease | None: ...
        def _write_round(self, s: Session, record: RoundRecord) -> RoundRow: ...

    def open_planned_round(self, record: RoundRecord, plan: RoundPlan, groups: Sequence[GroupAssignment], *,
                           fence: Lease | None = None) -> None:
        if record.state.is_terminal:
            raise InvalidRecordError(f"open_planned_round got terminal state {record.state}")
        fence = self._fence_for(fence)
        ordered = check_round_groups(plan, groups, record.number, None if fence is None else fence.token)

        def body(s: Session) -> None:
            check_fence(s, fence)
            self._write_round(s, record)  # the round row FOR UPDATE; ConflictError when terminal
            if s.get(RoundPlanRow, record.number) is not None:
                raise ConflictError(f"round {record.number} already has a plan")
            s.add(_plan_row(plan))
            s.flush()
            now = database_now(s)
            for g in ordered:
                s.add(_new_group_row(new_group_row(g, now)))
            s.flush()

        self._write(body)

    def round_plan(self, number: int) -> RoundPlan | None:
        def body(s: Session) -> RoundPlan | None:
            row = s.get(RoundPlanRow, number)
            return None if row is None else _plan(row)

        return self._read(body)

    def assigned_groups(self, member: Lease) -> list[GroupRow]:
        query = (select(RoundGroupRow).join(RoundRow, RoundRow.number == RoundGroupRow.round_number)
                 .where(RoundGroupRow.replica == member.holder, RoundGroupRow.replica_token == member.token,
                        RoundGroupRow.state == GroupState.ASSIGNED.value, RoundRow.state.not_in(_TERMINAL))
                 .order_by(RoundGroupRow.round_number, RoundGroupRow.group_index))
        return self._read(lambda s: [_group(r) for r in s.scalars(query)])

    def _replica_write(self, member: Lease, number: int, index: int, state: GroupState,
                       change: Callable[[GroupRow, float], GroupRow]) -> GroupRow:
        """The fenced read-check-write of a replica's group write (see the module doc)."""

        def body(s: Session) -> GroupRow:
            now = database_now(s)
            replica = s.scalars(select(ReplicaRow).where(ReplicaRow.name == member.holder)
                                .with_for_update(read=True)).first()
            if replica is None or replica.token != member.token or replica.expires_at <= now:
                raise FencedOut(f"{member.holder} is not a member under token {member.token}")
            round_row = s.scalars(select(RoundRow).where(RoundRow.number == number)
                                  .with_for_update(read=True)).first()
            if round_row is None or round_row.state in _TERMINAL:
                raise GroupClosed(f"round {number} is {'unknown' if round_row is None else round_row.state}")
            stored = s.scalars(select(RoundGroupRow).where(
                RoundGroupRow.round_number == number, RoundGroupRow.group_index == index)
                .with_for_update().execution_options(populate_existing=True)).first()
            if stored is None:
                raise GroupClosed(f"round {number} has no group {index}")
            row = _group(stored)
            if (row.assignment.replica, row.assignment.replica_token) != (member.holder, member.token):
                raise GroupClosed(f"group {index} of round {number} is not run by {member.holder}/{member.token}")
            check_write(row, state)
            after = change(row, now)
            _store_group(stored, after)
            if after.sum is not None:
                s.add(_sum_row(number, index, after.sum))
            s.flush()
            return after if after.sum is None else finished_without_sum(after)

        return self._write(body)

    def round_groups(self, number: int, *, sums: bool = False) -> list[GroupRow]:
        def body(s: Session) -> list[GroupRow]:
            rows = s.scalars(select(RoundGroupRow).where(RoundGroupRow.round_number == number)
                             .order_by(RoundGroupRow.group_index)).all()
            found = {} if not sums else {r.group_index: _sum(r) for r in s.scalars(
                select(RoundGroupSumRow).where(RoundGroupSumRow.round_number == number))}
            return [_group(r, found.get(r.group_index)) for r in rows]

        return self._read(body)

    def close_groups(self, number: int, *, replicas: Iterable[str] | None = None,
                     fence: Lease | None = None) -> list[GroupRow]:
        fence = self._fence_for(fence)
        chosen = None if replicas is None else frozenset(replicas)

        def body(s: Session) -> list[GroupRow]:
            check_fence(s, fence)
            round_row = s.scalars(select(RoundRow).where(RoundRow.number == number).with_for_update()).first()
            if round_row is None:
                raise NotFoundError(f"round {number} does not exist")
            if round_row.state in _TERMINAL:
                raise ConflictError(f"round {number} is already {round_row.state}")
            return _close(s, number, chosen)

        return self._write(body)

    def round_outcome(self, number: int) -> RoundOutcome | None:
        def body(s: Session) -> RoundOutcome | None:
            row = s.scalars(select(RoundRow).where(RoundRow.number == number)).first()
            if row is None:
                return None
            plan = s.get(RoundPlanRow, number)
            version = plan.new_model_version if plan is not None else None
            if version is None and row.state == RoundState.COMMITTED.value:
                version = s.scalar(select(ModelVersionRow.id).where(ModelVersionRow.round_number == number))
            return RoundOutcome(RoundState(row.state), version, row.abort_reason)

        return self._read(body)


def finished_without_sum(row: GroupRow) -> GroupRow:
    return GroupRow(**{**{n: getattr(row, n) for n in GroupRow.__dataclass_fields__}, "sum": None})


def _close(s: Session, number: int, replicas: frozenset[str] | None) -> list[GroupRow]:
    """Every open group of round `number` (of `replicas`, or all) lost;
    the round row is locked FOR UPDATE by the caller. Ascending index."""
    query = (select(RoundGroupRow).where(RoundGroupRow.round_number == number, RoundGroupRow.state.in_(OPEN_STATES))
             .order_by(RoundGroupRow.group_index).with_for_update().execution_options(populate_existing=True))
    now = database_now(s)
    out = []
    for stored in s.scalars(query).all():
        if replicas is None or stored.replica in replicas:
            after = lost(_group(stored), now)
            _store_group(stored, after)
            out.append(after)
    s.flush()
    return out


def seal_round(s: Session, number: int, new_model_version: int | None) -> list[GroupRow]:
    """Inside the transaction that makes round `number` terminal (its round
    row already locked FOR UPDATE): every open group lost, the round's sums
    deleted, the plan's `new_model_version` set (on commit). Returns every
    group row of the round after the seal, by index ([] without a plan)."""
    plan = s.get(RoundPlanRow, number, with_for_update=True)
    if plan is None:
        return []
    _close(s, number, None)
    s.execute(delete(RoundGroupSumRow).where(RoundGroupSumRow.round_number == number))
    if new_model_version is not None:
        plan.new_model_version = new_model_version
    s.flush()
    rows = s.scalars(select(RoundGroupRow).where(RoundGroupRow.round_number == number)
                     .order_by(RoundGroupRow.group_index)).all()
    return [_group(r) for r in rows]


# ---------------------------------------------------------------- mapping
def _plan_row(p: RoundPlan) -> RoundPlanRow:
    return RoundPlanRow(
        round_number=p.round_number, lease_token=p.lease_token, nonce=p.nonce, model_name=p.model_name,
        model_version=p.model_version, step=p.step, hyperparameters=dict(p.hyperparameters),
        metric_names=list(p.metric_names), cohort_size=p.cohort_size, minimum=p.minimum,
        rotation_key=p.rotation_key, deadlines=dict(p.deadlines), task_deadlines=dict(p.task_deadlines),
        opened_at=p.opened_at, closes_at=p.closes_at, devices_left_out=p.devices_left_out,
        left_out=dict(p.left_out), new_model_version=p.new_model_version)


def _plan(r: RoundPlanRow) -> RoundPlan:
    return RoundPlan(
        round_number=r.round_number, lease_token=r.lease_token, nonce=bytes(r.nonce), model_name=r.model_name,
        model_version=r.model_version, step=r.step, hyperparameters=r.hyperparameters,
        metric_names=tuple(r.metric_names), cohort_size=r.cohort_size, minimum=r.minimum,
        rotation_key=bytes(r.rotation_key), deadlines=r.deadlines, task_deadlines=r.task_deadlines,
        opened_at=r.opened_at, closes_at=r.closes_at, devices_left_out=r.devices_left_out, left_out=r.left_out,
        new_model_version=r.new_model_version)


def _new_group_row(g: GroupRow) -> RoundGroupRow:
    a = g.assignment
    stored = RoundGroupRow(round_number=a.round_number, group_index=a.index, replica=a.replica,
                           replica_token=a.replica_token, members=list(a.members), secagg_settings=a.secagg_settings,
                           session_id=a.session_id, dp_settings=a.dp_settings)
    _store_group(stored, g)
    return stored


def _store_group(stored: RoundGroupRow, g: GroupRow) -> None:
    """Write `g`'s mutable fields into `stored`."""
    stored.state, stored.lost_in, stored.phase = g.state.value, g.lost_in and g.lost_in.value, g.phase
    stored.asked = None if g.asked is None else list(g.asked)
    stored.survivors = {k: list(v) for k, v in g.survivors.items()}
    stored.dropouts = {k: list(v) for k, v in g.dropouts.items()}
    stored.timings, stored.completion = dict(g.timings), dict(g.completion)
    stored.counted = None if g.counted is None else list(g.counted)
    stored.share_reports = [list(p) for p in g.share_reports]
    stored.share_check_survivors = list(g.share_check_survivors)
    stored.fail_reason, stored.updated_at = g.fail_reason, g.updated_at


def _group(r: RoundGroupRow, found: EncodedSum | None = None) -> GroupRow:
    a = GroupAssignment(round_number=r.round_number, index=r.group_index, replica=r.replica,
                        replica_token=r.replica_token, members=tuple(r.members),
                        secagg_settings=bytes(r.secagg_settings), session_id=bytes(r.session_id),
                        dp_settings=None if r.dp_settings is None else bytes(r.dp_settings))
    ids: Callable[[Any], tuple[int, ...]] = lambda v: tuple(int(d) for d in v)  # noqa: E731
    return GroupRow(
        assignment=a, state=GroupState(r.state), lost_in=None if r.lost_in is None else GroupState(r.lost_in),
        phase=r.phase, asked=None if r.asked is None else ids(r.asked),
        survivors={k: ids(v) for k, v in r.survivors.items()}, dropouts={k: ids(v) for k, v in r.dropouts.items()},
        timings={k: float(v) for k, v in r.timings.items()}, completion=dict(r.completion),
        counted=None if r.counted is None else ids(r.counted),
        share_reports=tuple((int(p[0]), int(p[1])) for p in r.share_reports),
        share_check_survivors=ids(r.share_check_survivors), fail_reason=r.fail_reason,
        updated_at=float(r.updated_at), sum=found)


def _sum_row(number: int, index: int, found: EncodedSum) -> RoundGroupSumRow:
    return RoundGroupSumRow(round_number=number, group_index=index, encoded_sum=found.encoded_sum.tobytes(),
                            metric_limbs=found.metric_limbs.tobytes(), vector_length=found.vector_length,
                            metric_coordinates=found.metric_coordinates, sha256=found.sha256)


def _sum(r: RoundGroupSumRow) -> EncodedSum:
    encoded, limbs = bytes(r.encoded_sum), bytes(r.metric_limbs)
    actual = sum_digest(encoded, limbs)
    if actual != r.sha256:
        raise CorruptBlobError(r.group_index, r.sha256, actual)
    return EncodedSum(encoded, limbs, r.vector_length, r.metric_coordinates)  # type: ignore[arg-type]
