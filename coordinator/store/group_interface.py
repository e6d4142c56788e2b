"""Rounds run in groups by the replica tier: the part of the Store
interface for round plans, group rows, group results and the sealing of a
round's groups (records and rules: coordinator/store/group_records.py).
`Store` extends it; the general contract of coordinator/store/interface.py
holds (every method one transaction, thread- and process-safe, store
errors only).

Who writes what:
  * the leader (fenced by its leader lease, as `commit_round`):
    `open_planned_round`, `close_groups`, and the sealing that
    `commit_round`, `abort_round` and `mark_interrupted_rounds_aborted`
    do in their own transactions;
  * a replica (fenced by its membership term, as `publish_streams`:
    FencedOut unless `member` is its replica's running term): the groups
    assigned to that very term, `start_group`, `save_group_progress`,
    `finish_group`. Such a write is refused with GroupClosed (nothing
    written) when the round is terminal or unknown, the group names
    another replica or term, the group is final, or the write would move
    its state backwards (group_records.check_write).

Sealing: when a round with a plan becomes terminal, in the same
transaction, every open group becomes `lost` (`lost_in` its state), the
round's sums are deleted, and on commit the plan's `new_model_version` is
set. A round without a plan is written exactly as before.

Lock order on PostgreSQL (every writer takes row locks in this order, so
none deadlocks another): the leader lease row (a leader's write, FOR
SHARE) -> the replica's membership row (a replica's write, FOR SHARE) ->
the round row -> the round's group rows, ascending index. A replica's save
takes the round row FOR SHARE and its group row FOR UPDATE; `close_groups`
and the sealing take the round row FOR UPDATE, then the group rows. So a
replica's save of `unmasking` and the leader's close of that group are
serialised: either the save commits first (the close then finds the group
in `unmasking` and writes it `lost_in=unmasking`: its devices may have been
asked, and its sum is charged as released) or the close commits first (the
save is refused, and the replica asks no device to unmask). This is D94's
invariant, group by group.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from coordinator.store.group_records import (
    GroupAssignment,
    GroupProgress,
    GroupResult,
    GroupRow,
    RoundOutcome,
    RoundPlan,
)
from coordinator.store.lease_records import Lease
from coordinator.store.records import RoundRecord


@runtime_checkable
class GroupStore(Protocol):
    def open_planned_round(self, record: RoundRecord, plan: RoundPlan, groups: Sequence[GroupAssignment], *,
                           fence: Lease | None = None) -> None:
        """In ONE transaction fenced by the leader lease (as commit_round;
        the default fence when none is given): write the round record in a
        non-terminal state (as save_round_progress), its plan, and one row
        per group in state `assigned`. Raises FencedOut (a deposed leader),
        InvalidRecordError (a terminal record; a plan or group of another
        round; groups not numbered 0..n-1, sharing a device, or not holding
        `plan.cohort_size` devices; a plan whose lease token is not the
        fence's), ConflictError (the round is terminal or already has a
        plan). Nothing is written when it raises."""
        ...

    def round_plan(self, number: int) -> RoundPlan | None:
        """Round `number`'s plan (None when it has none)."""
        ...

    def assigned_groups(self, member: Lease) -> list[GroupRow]:
        """The groups in state `assigned` whose replica and token are
        `member`'s, of rounds not terminal, by (round, index); no sums."""
        ...

    def start_group(self, member: Lease, number: int, index: int) -> GroupRow:
        """Move the group from `assigned` to `running` (a no-op on a
        running group); returns the row. Fenced as the module doc says."""
        ...

    def save_group_progress(self, member: Lease, progress: GroupProgress) -> GroupRow:
        """Save a stage change of a running group (`running` or
        `unmasking`; no state moves backwards; in `unmasking` the devices
        asked, a superset of those saved before). Every device it names
        must be a member (InvalidRecordError). Returns the row. Fenced as
        the module doc says: when this returns in `unmasking`, the leader
        will see the group's asked devices whatever happens next."""
        ...

    def finish_group(self, member: Lease, result: GroupResult) -> GroupRow:
        """End the group: `done` (only from `unmasking`) with its sum,
        written with the row in one transaction, or `failed` with its
        reason. Devices named must be members (InvalidRecordError).
        Returns the row, without the sum. Fenced as the module doc says."""
        ...

    def round_groups(self, number: int, *, sums: bool = False) -> list[GroupRow]:
        """Round `number`'s groups by index (none: []); with `sums`, each
        done group's sum while the round runs (a sum whose sha256 does not
        match raises CorruptBlobError, its `version_id` the group index)."""
        ...

    def close_groups(self, number: int, *, replicas: Iterable[str] | None = None,
                     fence: Lease | None = None) -> list[GroupRow]:
        """Leader-fenced (as commit_round): every open group of round
        `number` (of the named replicas, or all) becomes `lost`, `lost_in`
        the state it was in. Returns the rows it closed, by index. Raises
        FencedOut, ConflictError (the round is terminal), NotFoundError (no
        such round)."""
        ...

    def round_outcome(self, number: int) -> RoundOutcome | None:
        """Round `number`'s state, the model version its commit produced
        and its abort reason; None for an unknown round."""
        ...
