"""Rounds in groups in the in-memory store: round plans, group rows and
their sums. A mixin of `InMemoryStore`, whose commit_round, abort_round and
mark_interrupted_rounds_aborted seal a round's groups with `_sealing` and
`_publish_groups` under their own locks; the contracts are those of
coordinator/store/group_interface.py.

Locks: a leader's write holds the lease lock, then the store's lock; a
replica's write holds the replica tier's lock (its membership), then the
store's lock; so each write sees the round, its plan and its groups in one
state and publishes its changes with assignments after every check (a
refused call leaves nothing behind). Group rows carry their sums while
the round runs (`GroupRow.sum`); a reader gets them only when it asks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from coordinator.store.errors import ConflictError, InvalidRecordError, NotFoundError
from coordinator.store.group_records import (
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
)
from coordinator.store.group_writes import ReplicaGroupWrites
from coordinator.store.lease_records import FencedOut, Lease
from coordinator.store.records import ModelVersion, RoundRecord, RoundState
from coordinator.store.replica_records import ReplicaRecord

_Key = tuple[int, int]  # (round number, group index)


@dataclass(slots=True)
class GroupTables:
    """The plans and group rows (copied on write)."""

    plans: dict[int, RoundPlan] = field(default_factory=dict)
    groups: dict[_Key, GroupRow] = field(default_factory=dict)

    def copy(self) -> GroupTables:
        return GroupTables(dict(self.plans), dict(self.groups))

    def of_round(self, number: int) -> list[GroupRow]:
        return [g for (n, _), g in sorted(self.groups.items()) if n == number]


def _without_sum(row: GroupRow) -> GroupRow:
    if row.sum is None:
        return row
    return GroupRow(**{**{n: getattr(row, n) for n in GroupRow.__dataclass_fields__}, "sum": None})


class InMemoryRoundGroups(ReplicaGroupWrites):
    """Round plans, group rows and sums in process memory (see the module doc)."""

    if TYPE_CHECKING:  # provided by InMemoryStore and its other mixins
        _lock: threading.RLock
        _lease_lock: threading.RLock
        _replicas_lock: threading.RLock
        _members: dict[str, ReplicaRecord]
        _replica_clock: Callable[[], float]
        _default_fence: Callable[[], Lease] | None

        def _check_fence(self, fence: Lease | None) -> None: ...
        def _stored_round(self, number: int) -> RoundRecord | None: ...
        def _stage_round(self, record: RoundRecord) -> Callable[[], None]: ...
        def _models(self) -> Mapping[int, ModelVersion]: ...

    def __init__(self) -> None:
        self._tables = GroupTables()

    def open_planned_round(self, record: RoundRecord, plan: RoundPlan, groups: Sequence[GroupAssignment], *,
                           fence: Lease | None = None) -> None:
        if record.state.is_terminal:
            raise InvalidRecordError(f"open_planned_round got terminal state {record.state}")
        with self._lease_lock, self._lock:
            effective = fence if fence is not None or self._default_fence is None else self._default_fence()
            self._check_fence(effective)
            ordered = check_round_groups(plan, groups, record.number, None if effective is None else effective.token)
            publish_round = self._stage_round(record)  # ConflictError when terminal
            if record.number in self._tables.plans:
                raise ConflictError(f"round {record.number} already has a plan")
            staged = self._tables.copy()
            staged.plans[record.number] = plan
            now = self._replica_clock()
            for g in ordered:
                staged.groups[(record.number, g.index)] = new_group_row(g, now)
            publish_round()
            self._tables = staged

    def round_plan(self, number: int) -> RoundPlan | None:
        with self._lock:
            return self._tables.plans.get(number)

    def assigned_groups(self, member: Lease) -> list[GroupRow]:
        with self._lock:
            return [_without_sum(g) for _, g in sorted(self._tables.groups.items())
                    if g.state is GroupState.ASSIGNED
                    and (g.assignment.replica, g.assignment.replica_token) == (member.holder, member.token)
                    and not self._terminal(g.round_number)]

    def _terminal(self, number: int) -> bool:
        stored = self._stored_round(number)
        return stored is None or stored.state.is_terminal

    def _replica_write(self, member: Lease, number: int, index: int, state: GroupState,
                       change: Callable[[GroupRow, float], GroupRow]) -> GroupRow:
        with self._replicas_lock, self._lock:
            now = self._replica_clock()
            replica = self._members.get(member.holder)
            if replica is None or replica.token != member.token or replica.expires_at <= now:
                raise FencedOut(f"{member.holder} is not a member under token {member.token}")
            if self._terminal(number):
                raise GroupClosed(f"round {number} is unknown or terminal")
            row = self._tables.groups.get((number, index))
            if row is None:
                raise GroupClosed(f"round {number} has no group {index}")
            if (row.assignment.replica, row.assignment.replica_token) != (member.holder, member.token):
                raise GroupClosed(f"group {index} of round {number} is not run by {member.holder}/{member.token}")
            check_write(row, state)
            after = change(row, now)
            staged = self._tables.copy()
            staged.groups[(number, index)] = after
            self._tables = staged
            return _without_sum(after)

    def round_groups(self, number: int, *, sums: bool = False) -> list[GroupRow]:
        with self._lock:
            rows = self._tables.of_round(number)
        return rows if sums else [_without_sum(g) for g in rows]

    def close_groups(self, number: int, *, replicas: Iterable[str] | None = None,
                     fence: Lease | None = None) -> list[GroupRow]:
        chosen = None if replicas is None else frozenset(replicas)
        with self._lease_lock, self._lock:
            self._check_fence(fence)
            stored = self._stored_round(number)
            if stored is None:
                raise NotFoundError(f"round {number} does not exist")
            if stored.state.is_terminal:
                raise ConflictError(f"round {number} is already {stored.state}")
            staged = self._tables.copy()
            closed = _close(staged, number, chosen, self._replica_clock())
            self._tables = staged
            return [_without_sum(g) for g in closed]

    def round_outcome(self, number: int) -> RoundOutcome | None:
        with self._lock:
            stored = self._stored_round(number)
            if stored is None:
                return None
            plan = self._tables.plans.get(number)
            version = None if plan is None else plan.new_model_version
            if version is None and stored.state is RoundState.COMMITTED:
                version = next((m.id for m in self._models().values() if m.round_number == number), None)
            return RoundOutcome(stored.state, version, stored.abort_reason)

    # ------------------------------------------------------------ sealing
    def _sealing(self, versions: Mapping[int, int | None]) -> tuple[GroupTables, dict[int, list[GroupRow]]]:
        """The tables after sealing each round of `versions` (round number
        -> the model version its commit produced, or None), not yet
        published (`_publish_groups`), and each round's rows after the seal
        (without sums; [] for a round without a plan). Callers hold the
        store's lock from here to the publication."""
        staged = self._tables.copy()
        now = self._replica_clock()
        out: dict[int, list[GroupRow]] = {}
        for number, version in versions.items():
            plan = staged.plans.get(number)
            if plan is None:
                out[number] = []
                continue
            _close(staged, number, None, now)
            for key, g in list(staged.groups.items()):
                if key[0] == number and g.sum is not None:
                    staged.groups[key] = _without_sum(g)
            if version is not None:
                staged.plans[number] = RoundPlan(**{**{n: getattr(plan, n) for n in RoundPlan.__dataclass_fields__},
                                                    "new_model_version": version})
            out[number] = staged.of_round(number)
        return staged, out

    def _publish_groups(self, staged: GroupTables) -> None:
        self._tables = staged


def _close(staged: GroupTables, number: int, replicas: frozenset[str] | None, now: float) -> list[GroupRow]:
    """Every open group of round `number` (of `replicas`, or all) lost in `staged`."""
    out = []
    for g in staged.of_round(number):
        if not g.state.is_final and (replicas is None or g.assignment.replica in replicas):
            staged.groups[(number, g.index)] = after = lost(g, now)
            out.append(after)
    return out
