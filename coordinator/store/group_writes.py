"""A replica's three group writes, the same on every store: each is a
change of one group row (`group_records`' rules) that the store applies
inside its own fenced read-check-write, `_replica_write(member, number,
index, state, change)`: the membership term must be the replica's running
one, the row must name that (replica, term), the round must not be
terminal and the group not final, and `state` must be a forward move; then
`change(row, now)` is the new row, written with the store's clock `now`.
Refused writes write nothing (FencedOut, GroupClosed). The SQL and the
in-memory stores supply `_replica_write`; this mixin gives both the same
`start_group`, `save_group_progress` and `finish_group`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from coordinator.store.group_records import (
    GroupProgress,
    GroupResult,
    GroupRow,
    GroupState,
    check_member_ids,
    finished,
    progressed,
)
from coordinator.store.lease_records import Lease


class ReplicaGroupWrites(ABC):
    """`start_group`, `save_group_progress` and `finish_group` over the
    store's `_replica_write` (see the module doc; the contracts are
    `group_interface.GroupStore`'s)."""

    @abstractmethod
    def _replica_write(self, member: Lease, number: int, index: int, state: GroupState,
                       change: Callable[[GroupRow, float], GroupRow]) -> GroupRow:
        """The fenced read-check-write of one group row (see the module doc)."""

    def start_group(self, member: Lease, number: int, index: int) -> GroupRow:
        def change(row: GroupRow, now: float) -> GroupRow:
            if row.state is GroupState.RUNNING:  # started already: nothing changes
                return row
            return progressed(row, GroupProgress(round_number=number, index=index, state=GroupState.RUNNING,
                                                 phase=GroupState.RUNNING.value), now)

        return self._replica_write(member, number, index, GroupState.RUNNING, change)

    def save_group_progress(self, member: Lease, progress: GroupProgress) -> GroupRow:
        def change(row: GroupRow, now: float) -> GroupRow:
            check_member_ids(row, progress)
            return progressed(row, progress, now)

        return self._replica_write(member, progress.round_number, progress.index, progress.state, change)

    def finish_group(self, member: Lease, result: GroupResult) -> GroupRow:
        def change(row: GroupRow, now: float) -> GroupRow:
            check_member_ids(row, result)
            return finished(row, result, now)

        return self._replica_write(member, result.round_number, result.index, result.state, change)
