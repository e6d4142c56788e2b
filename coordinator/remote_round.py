"""A round whose groups replicas run, as the leader's reporting reads it
(pure; D109).

The in-process round loop hands its round machine to `round_record`,
`round_metrics`, `PrivacyLedger.entry_for` and `abort_charge`
(round_report.py, interrupted_charge.py). The leader of a tier holds no
machine: it holds the round's plan and its group rows. `RemoteRound` is
built from those (`RemoteRound.of(plan, rows)`, then `update(rows)` after
each read) and gives the same surface a `GroupedRoundMachine` gives those
functions, so they run unchanged: `number`, `phase`, `cohort` (every
group's members, group by group), `config` (a `GroupsShape`),
`survivors()`, `dropout_ids()`, `dropouts`, `timings`, `completion`,
`result`, `mechanism`, `metrics`, `abort_reason`, `abort_detail`, and,
as the `Grouped` protocol reads it, `machines` (one `GroupView` per group)
and `released()`.

Contracts, per group (`GroupView`):

- `config` is the group's bound config and `mechanism` its discrete
  Gaussian (None without it), both rebuilt from its row exactly as its
  replica rebuilds them (`assignment.stored_group`, `group_mechanism`).
- `result` is set (a `ReleasedSum`, which carries only `counted`) for
  every group whose sum the server may know: a `done` group (its counted
  devices), and any group whose devices may have been asked to unmask
  (`GroupRow.may_have_asked`: lost in `unmasking`, failed after its asked
  devices were saved), at its masked-input survivors as saved, else its
  asked devices, else one member: fewer counted devices never price a
  group lower. So `released()` lists every group a ledger entry must
  price, and `abort_charge` prices each of them as reconstructed: privacy
  is never under-reported.
- `survivors()` is its row's, with `unmasking` holding its asked devices
  when it may have asked.

And for the round:

- `survivors()` is the union over the groups that neither failed on
  their own (as `GroupedRoundMachine.survivors`) nor were lost (their
  replica died or was cut off: their sums are never added), so the
  masked-input survivors of a committed round are exactly its counted
  devices; every device any group
  may have asked added to `survivors["unmasking"]` (`merged_unmasking`),
  so the spent-device rules (D85) see them in the record the leader
  writes, committed or aborted.
- `dropouts` is the union of the rows' dropouts, and every other member of
  a failed or lost group at the furthest stage it timed ("group_aborted",
  "group_lost").
- `phase` follows the rows (the furthest stage of an open group; with no
  group open, AGGREGATING) until the planner sets its end (`ended`).
- `result` is the round's combined sum (`combine`), None before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from coordinator.assignment import StoredGroup, group_mechanism, round_metrics as metric_layout, stored_group
from coordinator.grouped_rounds import PHASE_ORDER, GroupsShape, cohort_config, combine_group_sums
from coordinator.aggregate import AggregateResult
from coordinator.store import GroupRow, GroupState, RoundPlan, RoundState
from coordinator.store.group_records import merged_unmasking
from dpmech.mechanism import MechanismConfig
from secagg.config import SecAggConfig
from wire.round_metrics import MetricLayout

COUNTED_AT = RoundState.MASKED_INPUT.value
UNMASKING = RoundState.UNMASKING.value
_STAGES = frozenset(s.value for s in RoundState if s.is_collecting)


@dataclass(frozen=True, slots=True)
class ReleasedSum:
    """A group's sum as its privacy charge reads it: the devices whose
    inputs (and noise) it holds, or may hold."""

    counted: tuple[int, ...]


def released_count(row: GroupRow) -> tuple[int, ...] | None:
    """The devices a group's possibly known sum is priced at (the module
    doc), or None when the server cannot know its sum."""
    if row.state is GroupState.DONE and row.counted:
        return tuple(row.counted)
    if not row.may_have_asked:
        return None
    return tuple(row.survivors.get(COUNTED_AT, ()) or row.asked or row.assignment.members[:1])


def stage_of(phase: str) -> RoundState:
    """A row's phase as a round state (a group not yet started: its first stage)."""
    try:
        return RoundState(phase)
    except ValueError:
        return RoundState.ADVERTISE_KEYS


class GroupView:
    """One group of the round, from its row (the module doc)."""

    def __init__(self, row: GroupRow, stored: StoredGroup, mechanism: MechanismConfig | None) -> None:
        self.row = row
        self.stored = stored
        self.number = row.round_number
        self.index = row.index
        self.cohort = list(row.assignment.members)
        self.config: SecAggConfig = stored.config
        self.mechanism = mechanism
        counted = released_count(row)
        self.result = ReleasedSum(counted) if counted is not None else None

    @property
    def phase(self) -> RoundState:
        return stage_of(self.row.phase)

    @property
    def timings(self) -> dict[str, float]:
        return dict(self.row.timings)

    def survivors(self) -> dict[str, list[int]]:
        out = {k: list(v) for k, v in self.row.survivors.items()}
        if self.row.may_have_asked and self.row.asked:
            out[UNMASKING] = sorted(set(out.get(UNMASKING, ())) | set(self.row.asked))
        return out

    def dropout_ids(self) -> dict[str, list[int]]:
        return {k: list(v) for k, v in self.row.dropouts.items() if v}

    def share_reports(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for reporter, reported in self.row.share_reports:
            out.setdefault(reporter, []).append(reported)
        return out

    def share_check_survivors(self) -> frozenset[int]:
        return frozenset(self.row.share_check_survivors)


class RemoteRound:
    """The round of `plan` over its group rows (the module doc)."""

    def __init__(self, plan: RoundPlan, groups: Sequence[StoredGroup], mechanisms: Sequence[MechanismConfig | None],
                 metrics: MetricLayout, rows: Sequence[GroupRow]) -> None:
        self.plan = plan
        self.number = plan.round_number
        self.metrics = metrics
        self._groups = tuple(groups)
        self._mechanisms = tuple(mechanisms)
        self.mechanism: MechanismConfig | None = self._mechanisms[0]
        self.rotation_key = bytes(groups[0].dp.rotation_key) if self.mechanism is not None else b""
        self.cohort = tuple(d for g in groups for d in g.assignment.members)
        configs = [g.config for g in groups]
        self.whole = cohort_config(configs[0], len(self.cohort))
        self.config = GroupsShape(
            num_clients=len(self.cohort), threshold=min(c.threshold for c in configs),
            degree=max(c.degree for c in configs), active_adversary=configs[0].active_adversary,
            groups=len(configs), sizes=tuple(len(g.assignment.members) for g in groups))
        self.result: AggregateResult | None = None
        self.abort_reason: int | None = None
        self.abort_detail = ""
        self.new_model_version: int | None = None
        self._ended: RoundState | None = None
        self.machines: tuple[GroupView, ...] = ()
        self.update(rows)

    @classmethod
    def of(cls, plan: RoundPlan, rows: Sequence[GroupRow]) -> RemoteRound:
        """The round from its plan and rows (every group, by index).
        WireError / DecodeError / ValueError for rows whose settings do not
        parse (the leader wrote them: a bug, not a replica's fault)."""
        ordered = sorted(rows, key=lambda r: r.index)
        groups = [stored_group(r.assignment) for r in ordered]
        metrics = metric_layout(plan, groups[0])
        return cls(plan, groups, [group_mechanism(plan, g, metrics) for g in groups], metrics, ordered)

    def update(self, rows: Iterable[GroupRow]) -> None:
        """Take the rows as last read (every group of the round)."""
        ordered = sorted(rows, key=lambda r: r.index)
        if [r.index for r in ordered] != [g.assignment.index for g in self._groups]:
            raise ValueError(f"round {self.number}: the rows are not the plan's groups")
        self.machines = tuple(GroupView(r, g, m) for r, g, m in zip(ordered, self._groups, self._mechanisms,
                                                                    strict=True))

    @property
    def rows(self) -> tuple[GroupRow, ...]:
        return tuple(v.row for v in self.machines)

    # ------------------------------------------------------------------ the round's state

    @property
    def phase(self) -> RoundState:
        if self._ended is not None:
            return self._ended
        open_ = [v.phase for v in self.machines if not v.row.state.is_final]
        if not open_:
            return RoundState.AGGREGATING
        return max(open_, key=lambda s: PHASE_ORDER[s])

    @property
    def all_final(self) -> bool:
        return all(v.row.state.is_final for v in self.machines)

    def ended(self, state: RoundState, *, reason: int | None = None, detail: str = "",
              new_model_version: int | None = None) -> None:
        """The planner committed (`new_model_version`) or aborted (`reason`, `detail`) the round."""
        self._ended = state
        self.abort_reason, self.abort_detail, self.new_model_version = reason, detail, new_model_version

    def combine(self, sums: Mapping[int, GroupRow]) -> AggregateResult | None:
        """The round's result over the done groups among `sums` (group
        index -> its row read with its sum): their sums added and decoded
        once (`combine_group_sums`, as the in-process grouped round does);
        None when no group is done. Sets `result`."""
        done = [sums[v.index] for v in self.machines if v.index in sums
                and sums[v.index].state is GroupState.DONE and sums[v.index].sum is not None]
        if not done:
            self.result = None
            return None
        self.result = combine_group_sums(
            self.whole, [_Sum(r) for r in done], metrics=self.metrics, mechanism=self.mechanism,
            rotation_key=self.rotation_key)
        return self.result

    def released(self) -> list[GroupView]:
        """The groups whose sums the server may know (the module doc)."""
        return [v for v in self.machines if v.result is not None]

    # ------------------------------------------------------------------ as a record reads it

    def survivors(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for v in self.machines:
            if v.row.state in _NOT_COUNTED:  # its sum is not added (a lost one may have been reconstructed by its
                continue                      # replica): its asked devices are merged below
            for stage, devices in v.row.survivors.items():
                out.setdefault(stage, []).extend(devices)
        return {k: sorted(set(d)) for k, d in merged_unmasking(out, self.rows).items()}

    @property
    def dropouts(self) -> dict[str, dict[int, str]]:
        out: dict[str, dict[int, str]] = {}
        for v in self.machines:
            for stage, devices in v.row.dropouts.items():
                out.setdefault(stage, {}).update((d, "dropped") for d in devices)
            if v.row.state in _NOT_COUNTED:
                gone = {d for devices in v.row.dropouts.values() for d in devices}
                stage = _furthest(v.row.timings)
                why = "group_aborted" if v.row.state is GroupState.FAILED else "group_lost"
                out.setdefault(stage, {}).update((d, why) for d in v.cohort if d not in gone)
        return out

    def dropout_ids(self) -> dict[str, list[int]]:
        return {k: sorted(v) for k, v in self.dropouts.items() if v}

    @property
    def timings(self) -> dict[str, float]:
        """Each stage's longest time over the groups."""
        return _longest(v.row.timings for v in self.machines)

    @property
    def completion(self) -> dict[str, float]:
        """Each stage's longest honest completion time over the groups."""
        return _longest({k: float(x) for k, x in v.row.completion.items() if isinstance(x, int | float)}
                        for v in self.machines)

    def share_reports(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for v in self.machines:
            for reporter, reported in v.share_reports().items():
                out.setdefault(reporter, []).extend(reported)
        return out

    def share_check_survivors(self) -> frozenset[int]:
        return frozenset().union(*(v.share_check_survivors() for v in self.machines))

    def live_devices(self) -> list[int]:
        """The members of the groups still open (the live gauges)."""
        return [d for v in self.machines if not v.row.state.is_final for d in v.cohort]

    def groups_by_replica(self) -> dict[str, int]:
        """Replica -> how many of the round's groups it runs."""
        out: dict[str, int] = {}
        for v in self.machines:
            out[v.row.assignment.replica] = out.get(v.row.assignment.replica, 0) + 1
        return dict(sorted(out.items()))


@dataclass(frozen=True, slots=True)
class _Sum:
    """A done row's sum as `combine_group_sums` adds it."""

    row: GroupRow

    @property
    def encoded_sum(self) -> np.ndarray:
        assert self.row.sum is not None
        return self.row.sum.encoded_sum

    @property
    def counted(self) -> Sequence[int]:
        return self.row.counted or ()


#: Group states whose sums the leader never adds.
_NOT_COUNTED = frozenset({GroupState.FAILED, GroupState.LOST})


def _furthest(timings: Mapping[str, float]) -> str:
    """The furthest stage among `timings`' keys (the first stage when none)."""
    stages = [RoundState(k) for k in timings if k in _STAGES]
    return max(stages, key=lambda s: PHASE_ORDER[s], default=RoundState.ADVERTISE_KEYS).value


def _longest(per_group: Iterable[Mapping[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for times in per_group:
        for k, x in times.items():
            out[k] = max(out.get(k, 0.0), float(x))
    return out


__all__ = ["GroupView", "ReleasedSum", "RemoteRound", "released_count", "stage_of"]
