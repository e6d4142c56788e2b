"""A round in groups over gRPC: one `RoundMachine` per group, in lockstep
(pure: events in, actions out, no I/O, no clock; D99).

`GroupedRoundMachine` has the surface of a `RoundMachine` (the round loop,
the record, the live view and the admin service drive either), over groups
that each run their own SecAgg(+) instance: their own session id (the
round's, tagged with the group), their own graph and threshold (sized for
the group), and the ONE encoding of the round, sized for the whole cohort,
so that the groups' unmasked sums add without wrapping (D87). With the
discrete Gaussian every group's devices rotate with the round's one
rotation key and encode at its one scale, so the groups' residues add too
(each group's noise shares may differ: distributed noise is split among a
group's own devices).

Lockstep. Every group opens its stages together. A stage closes in every
group when every group still collecting has nothing left to wait for, or,
group by group, at its deadline (all groups opened it at the same time, so
the deadlines are the same). The round's `phase` is the furthest stage a
group still collecting is in; it only differs between groups after a
group aborted.

A group that aborts (too few devices past its threshold) contributes
nobody; its devices get its AbortNotice and the other groups go on. When no
group is collecting any more, the round is AGGREGATING if the groups that
reached aggregation count at least `minimum` devices together, its result
the sum of their unmasked sums mod 2^w, decoded once with the round's
encoding (`counted` the union of their counted sets, disjoint):
`combine_group_sums`, a pure function of the groups' sums; otherwise
the round aborts and those groups' devices are told. `committed` tells
every counted group's devices (each with its own session id).

What a round in groups shows as one round: `cohort` (every group's devices,
group by group), `survivors` (the union, per stage, over the groups that did
not fail on their own, so that masked-input survivors are the counted
devices, as in a round of one instance), `dropouts` (the union, with a
failed group's other devices as "group_aborted"), `share_reports`, `timings` (a stage's longest time over the
groups), `completion` (the longest), and `config`, a `GroupsShape` (the
cohort, the smallest group threshold, the largest degree). The server
learns each group's sum; that is what the threat model says (D34, D87).

Group events are logged with `group=j`; a group's own end is logged as
`group_aborted` / `group_aggregate_ready` / `group_committed`, the round's
as `round_aborted` / `aggregate_ready` / `round_committed`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from coordinator.aggregate import AggregateResult, aggregate_result
from coordinator.rounds import (
    Action,
    AggregateReady,
    LogEvent,
    PhaseChanged,
    RoundEnded,
    RoundMachine,
)
from coordinator.store import RoundState
from dpmech.mechanism import MechanismConfig
from fedmask_proto.v1 import common_pb2
from secagg.config import SecAggConfig
from secagg.encoding import FixedPointEncoding
from wire import secagg_codec as codec
from wire.round_metrics import EMPTY_LAYOUT, MetricLayout
from wire.secagg_codec import reason_name

P = common_pb2

#: Group log events renamed so that a group's end never reads as the round's.
_GROUP_EVENTS = {"round_aborted": "group_aborted", "aggregate_ready": "group_aggregate_ready",
                 "round_committed": "group_committed"}


@dataclass(frozen=True, slots=True)
class GroupsShape:
    """The secure-aggregation shape of a round in groups, as one round's
    record and live view show it."""

    num_clients: int  # the whole cohort
    threshold: int  # the smallest group's Shamir threshold
    degree: int  # the largest group's graph degree
    active_adversary: bool
    groups: int
    sizes: tuple[int, ...]

    def describe(self) -> str:
        return (f"{self.groups} groups of {min(self.sizes)}-{max(self.sizes)} devices (n={self.num_clients}), "
                f"t>={self.threshold}, k<={self.degree}, {'active' if self.active_adversary else 'passive'}")


@dataclass
class GroupedRoundMachine:
    """See the module doc. Build it, send each group's RoundTasks (with
    `machines[j].config`), then call `start`."""

    number: int
    configs: Sequence[SecAggConfig]  # group j's instance (its devices, session id; the round's encoding)
    groups: Sequence[Sequence[int]]  # group j's device ids; index = secagg id in its instance
    deadlines: Mapping[str, float]
    minimum: int  # the fewest counted devices (over all groups) the round commits with
    identity_keys: Mapping[int, bytes] | None = None
    metrics: MetricLayout = EMPTY_LAYOUT
    #: Group j's discrete Gaussian (D88; None without it): one scale and field for the round, each
    #: device's noise share sized for its group under distributed noise (`round_machines.plan_groups`).
    mechanisms: Sequence[MechanismConfig | None] = ()
    rotation_key: bytes = b""  # with the mechanism: the rotation's key, the same in every group

    phase: RoundState = field(init=False, default=RoundState.ADVERTISE_KEYS)
    result: AggregateResult | None = field(init=False, default=None)
    abort_reason: int | None = field(init=False, default=None)
    abort_detail: str = field(init=False, default="")
    new_model_version: int | None = field(init=False, default=None)
    machines: tuple[RoundMachine, ...] = field(init=False)
    cohort: tuple[int, ...] = field(init=False)
    config: GroupsShape = field(init=False)
    whole: SecAggConfig = field(init=False)  # the cohort-level config the sum is decoded with
    _unmasking_opened: bool = field(init=False, default=False)  # a group opened unmasking since the last settle
    _failed: dict[int, str] = field(init=False, default_factory=dict)  # group -> the phase it aborted in, on its own

    def __post_init__(self) -> None:
        if len(self.configs) != len(self.groups) or not self.groups:
            raise ValueError(f"{len(self.groups)} groups for {len(self.configs)} configs")
        self.cohort = tuple(d for g in self.groups for d in g)
        if len(set(self.cohort)) != len(self.cohort):
            raise ValueError("a device is in two groups")
        first = self.configs[0].encoding
        scale = (first.clip, first.modulus_bits, first.max_level)
        if any((c.encoding.clip, c.encoding.modulus_bits, c.encoding.max_level) != scale for c in self.configs):
            raise ValueError("every group must have the round's one encoding")
        if len({c.session_id for c in self.configs}) != len(self.configs):
            raise ValueError("two groups share a session id")
        self.mechanisms = tuple(self.mechanisms) or (None,) * len(self.groups)
        if len(self.mechanisms) != len(self.groups):
            raise ValueError(f"{len(self.mechanisms)} mechanisms for {len(self.groups)} groups")
        first_mech = self.mechanisms[0]
        if first_mech is not None and not self.rotation_key:
            raise ValueError("the groups' discrete Gaussian needs the round's rotation key (their sums must add)")
        if any((m is None) != (first_mech is None) or (m is not None and first_mech is not None and
               (m.scale, m.bits, m.dim) != (first_mech.scale, first_mech.bits, first_mech.dim))
               for m in self.mechanisms):
            raise ValueError("every group's discrete Gaussian must have the round's scale, field and length")
        if not 1 <= self.minimum <= len(self.cohort):
            raise ValueError(f"minimum {self.minimum} outside 1..{len(self.cohort)}")
        self.whole = cohort_config(self.configs[0], len(self.cohort))
        self.machines = tuple(
            RoundMachine(number=self.number, config=c, cohort=list(g), deadlines=self.deadlines,
                         identity_keys=self.identity_keys, metrics=self.metrics, mechanism=mech,
                         rotation_key=self.rotation_key)
            for c, g, mech in zip(self.configs, self.groups, self.mechanisms, strict=True)
        )
        self._group_of = {d: j for j, g in enumerate(self.groups) for d in g}
        self.config = GroupsShape(
            num_clients=len(self.cohort), threshold=min(c.threshold for c in self.configs),
            degree=max(c.degree for c in self.configs), active_adversary=self.configs[0].active_adversary,
            groups=len(self.groups), sizes=tuple(len(g) for g in self.groups))

    # ------------------------------------------------------------------ the round as one

    @property
    def mechanism(self) -> MechanismConfig | None:
        """The round's discrete Gaussian as the sum is decoded (group 0's:
        every group has the same scale, field and length)."""
        return self.mechanisms[0]

    def released(self) -> list[RoundMachine]:
        """The groups whose sums were reconstructed (they reached aggregation)."""
        return [m for m in self.machines if m.result is not None]

    @property
    def deadline(self) -> float:
        return min((m.deadline for m in self._collecting()), default=math.inf)

    @property
    def wants_close(self) -> bool:
        collecting = self._collecting()
        return bool(collecting) and all(m.wants_close for m in collecting)

    @property
    def pending_count(self) -> int:
        return sum(m.pending_count for m in self.machines)

    @property
    def timings(self) -> dict[str, float]:
        """Each phase's longest time over the groups."""
        return _longest(m.timings for m in self.machines)

    @property
    def completion(self) -> dict[str, float]:
        """Each stage's longest honest completion time over the groups."""
        return _longest(m.completion for m in self.machines)

    @property
    def dropouts(self) -> dict[str, dict[int, str]]:
        """The groups' dropouts, and every other device of a group that
        failed, at the stage it failed in ("group_aborted")."""
        out: dict[str, dict[int, str]] = {}
        for m in self.machines:
            for phase, devices in m.dropouts.items():
                out.setdefault(phase, {}).update(devices)
        for j, phase in self._failed.items():
            gone = {d for devices in self.machines[j].dropouts.values() for d in devices}
            out.setdefault(phase, {}).update((d, "group_aborted") for d in self.groups[j] if d not in gone)
        return out

    def has_device(self, device_id: int) -> bool:
        return device_id in self._group_of

    def group_of(self, device_id: int) -> int | None:
        return self._group_of.get(device_id)

    def live_devices(self) -> list[int]:
        return [d for m in self.machines for d in m.live_devices()]

    def survivors(self) -> dict[str, list[int]]:
        """phase value -> the devices that completed it, over the groups
        that did not fail on their own: a failed group's sum is never
        reconstructed, so its devices are not counted (they show among the
        dropouts). A group the round cancelled stays: its sum may have been
        reconstructed (an interrupted round's charge counts it, D85)."""
        out: dict[str, list[int]] = {}
        for j, m in enumerate(self.machines):
            if j in self._failed:
                continue
            for stage, devices in m.survivors().items():
                out.setdefault(stage, []).extend(devices)
        return {k: sorted(v) for k, v in out.items()}

    def share_reports(self) -> dict[int, list[int]]:
        return {k: v for m in self.machines for k, v in m.share_reports().items()}

    def share_check_survivors(self) -> frozenset[int]:
        return frozenset().union(*(m.share_check_survivors() for m in self.machines))

    def dropout_ids(self) -> dict[str, list[int]]:
        return {k: sorted(v) for k, v in self.dropouts.items() if v}

    # ------------------------------------------------------------------ events

    def start(self, now: float) -> list[Action]:
        actions: list[Action] = []
        for j, m in enumerate(self.machines):
            actions += self._from_group(j, m.start(now))
        return actions + [PhaseChanged(self.phase),
                          LogEvent("groups_formed", {"round": self.number, "groups": len(self.groups),
                                                     "sizes": ",".join(str(len(g)) for g in self.groups)})]

    def handle(self, device_id: int, message: Any, now: float) -> list[Action]:
        j = self._group_of.get(device_id)
        if j is None:
            return [LogEvent("message_discarded", {"round": self.number, "device": device_id,
                                                   "kind": type(message).__name__, "why": "not in this round's cohort"})]
        return self._settle(self._step(j, lambda m: m.handle(device_id, message, now)), now)

    def device_lost(self, device_id: int, now: float, why: str = "disconnected") -> list[Action]:
        j = self._group_of.get(device_id)
        if j is None:
            return []
        return self._settle(self._step(j, lambda m: m.device_lost(device_id, now, why)), now)

    def tick(self, now: float) -> list[Action]:
        """Close the open stage in every group when no group still waits for
        anyone, or in each group whose deadline passed (lockstep)."""
        actions: list[Action] = []
        everyone = self.wants_close
        for j, m in enumerate(self.machines):
            if m.phase.is_collecting and (everyone or now >= m.deadline):
                actions += self._step(j, lambda m: m.tick(now))
        return self._settle(actions, now)

    def cancel(self, reason: codec.ProtoAbortReason, detail: str, now: float) -> list[Action]:
        if self.phase.is_terminal:
            return []
        actions: list[Action] = []
        for j, m in enumerate(self.machines):
            actions += self._from_group(j, m.cancel(reason, detail, now))
        return actions + self._end_aborted(reason, detail)

    def committed(self, new_model_version: int, now: float) -> list[Action]:
        """The runner committed the round: every counted group tells its devices."""
        if self.phase is not RoundState.AGGREGATING or self.result is None:
            raise RuntimeError(f"committed() in phase {self.phase.value}")
        actions: list[Action] = []
        for j, m in enumerate(self.machines):
            if m.phase is RoundState.AGGREGATING:
                actions += self._from_group(j, m.committed(new_model_version, now))
        self.phase = RoundState.COMMITTED
        self.new_model_version = new_model_version
        return actions + [PhaseChanged(self.phase), RoundEnded(True),
                          self._log("round_committed", version=new_model_version,
                                    contributors=len(self.result.counted))]

    def commit_failed(self, detail: str, now: float) -> list[Action]:
        if self.phase is not RoundState.AGGREGATING or self.result is None:
            raise RuntimeError(f"commit_failed() in phase {self.phase.value}")
        actions: list[Action] = []
        for j, m in enumerate(self.machines):
            if m.phase is RoundState.AGGREGATING:
                actions += self._from_group(j, m.commit_failed(detail, now))
        return actions + self._end_aborted(P.ABORT_REASON_CANCELLED, f"commit failed: {detail}")

    # ------------------------------------------------------------------ internals

    def _step(self, j: int, event: Callable[[RoundMachine], list[Action]]) -> list[Action]:
        """Group j's event (a message, a loss, a tick); a group that aborts
        on it has failed on its own, at the phase it was in."""
        m = self.machines[j]
        before = m.phase
        actions = self._from_group(j, event(m))
        if m.phase is RoundState.ABORTED and before is not RoundState.ABORTED:
            self._failed[j] = before.value
        return actions

    def _collecting(self) -> list[RoundMachine]:
        return [m for m in self.machines if m.phase.is_collecting]

    def _log(self, event: str, **fields: Any) -> LogEvent:
        return LogEvent(event, {"round": self.number, **fields})

    def _from_group(self, j: int, actions: Iterable[Action]) -> list[Action]:
        """Group j's actions as the round's: its messages as they are, its
        log events tagged with the group, its phase changes and its end
        kept back (the round has its own, from `_settle`). A group opening
        unmasking makes the round announce UNMASKING again, even when another
        group opened it before: the round loop saves who is asked first."""
        out: list[Action] = []
        for a in actions:
            if isinstance(a, LogEvent):
                out.append(LogEvent(_GROUP_EVENTS.get(a.event, a.event), {**a.fields, "group": j}))
            elif isinstance(a, PhaseChanged):
                self._unmasking_opened |= a.phase is RoundState.UNMASKING
            elif not isinstance(a, AggregateReady | RoundEnded):
                out.append(a)
        return out

    def _settle(self, actions: list[Action], now: float) -> list[Action]:
        """The round's phase from its groups' (see the module doc), and its
        own PhaseChanged, AggregateReady or end when they move it."""
        if self.phase.is_terminal or self.phase is RoundState.AGGREGATING:
            return actions
        collecting = self._collecting()
        opened, self._unmasking_opened = self._unmasking_opened, False
        if collecting:
            furthest = max(collecting, key=lambda m: PHASE_ORDER[m.phase]).phase
            if furthest is not self.phase or (opened and furthest is RoundState.UNMASKING):
                self.phase = furthest
                actions.append(PhaseChanged(furthest))
            return actions
        return actions + self._finish(now)

    def _finish(self, now: float) -> list[Action]:
        """No group collects any more: aggregate the groups that reached
        aggregation, or abort the round."""
        done = [(j, m) for j, m in enumerate(self.machines) if m.phase is RoundState.AGGREGATING and m.result]
        counted = sum(len(m.result.counted) for _, m in done if m.result is not None)
        if not done or counted < self.minimum:
            actions: list[Action] = []
            if done:
                detail = f"too_few_survivors: {counted} devices counted over the groups, minimum {self.minimum}"
                reason: codec.ProtoAbortReason = P.ABORT_REASON_TOO_FEW_SURVIVORS
            else:
                first = next(m for m in self.machines if m.abort_reason is not None)
                reason = P.AbortReason.ValueType(first.abort_reason or P.ABORT_REASON_TOO_FEW_SURVIVORS)
                detail = f"every group aborted (the first: {first.abort_detail})"
            for j, m in done:
                actions += self._from_group(j, m.cancel(reason, detail, now))
            return actions + self._end_aborted(reason, detail)
        self.result = combine_group_sums(self.whole, [m.result for _, m in done if m.result is not None],
                                         metrics=self.metrics, mechanism=self.mechanisms[0],
                                         rotation_key=self.rotation_key)
        self.phase = RoundState.AGGREGATING
        return [PhaseChanged(self.phase), AggregateReady(self.result),
                self._log("aggregate_ready", counted=len(self.result.counted), groups=len(done))]

    def _end_aborted(self, reason: codec.ProtoAbortReason, detail: str) -> list[Action]:
        self.phase = RoundState.ABORTED
        self.abort_reason = reason
        self.abort_detail = detail
        return [PhaseChanged(self.phase), RoundEnded(False, reason, detail),
                self._log("round_aborted", reason=reason_name(reason), detail=detail)]


class GroupSum(Protocol):
    """One group's unmasked sum as `combine_group_sums` adds it: a group
    machine's `AggregateResult`, or the same two fields read back."""

    @property
    def encoded_sum(self) -> np.ndarray:
        """uint32 (L + M,): the group's unmasked sum mod 2^w, metric limbs included."""
        ...

    @property
    def counted(self) -> Sequence[int]:
        """The device ids whose inputs are in it."""
        ...


def cohort_config(group: SecAggConfig, cohort: int) -> SecAggConfig:
    """The cohort-level config a round in groups decodes its sum with: group
    `group`'s (every group has the round's one encoding) with the encoding
    sized for all `cohort` devices. Decoding reads only the encoding and
    the vector length; the graph fields just have to be valid."""
    e = group.encoding
    encoding = FixedPointEncoding(e.clip, cohort, e.modulus_bits, e.max_level)
    return dataclasses.replace(group, num_clients=cohort, degree=cohort - 1, threshold=cohort, encoding=encoding)


def combine_group_sums(whole: SecAggConfig, sums: Iterable[GroupSum], *, metrics: MetricLayout = EMPTY_LAYOUT,
                       mechanism: MechanismConfig | None = None, rotation_key: bytes = b"") -> AggregateResult:
    """The round's result over the given groups' sums (pure): their sum mod
    2^32, reduced mod 2^w and decoded ONCE by `aggregate_result` with
    `whole` (`cohort_config`: the round's encoding, sized for the cohort, so
    no sum over a subset of its devices wraps, D87), the round's metric
    layout and, with the discrete Gaussian, the round's `mechanism` and
    `rotation_key`; `counted` is the union of the groups' counted sets,
    sorted. Which groups to add (those that reached aggregation, counting
    at least the round's minimum) is the caller's. ValueError for no sums
    or a device counted in two of them (a round's groups are disjoint)."""
    total = np.zeros(whole.vector_length, dtype=np.uint64)
    members: list[int] = []
    given = 0
    for s in sums:
        total += s.encoded_sum
        members.extend(s.counted)
        given += 1
    if not given:
        raise ValueError("no group sum to combine")
    if len(set(members)) != len(members):
        raise ValueError("a device is counted in two group sums")
    words = (total & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    return aggregate_result(whole, metrics, words, tuple(sorted(members)), mechanism, rotation_key)


def _longest(per_group: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Key -> the largest value any of the mappings gives it."""
    out: dict[str, float] = {}
    for times in per_group:
        for k, v in times.items():
            out[k] = max(out.get(k, 0.0), v)
    return out


#: A collecting phase's place in the protocol.
PHASE_ORDER: dict[RoundState, int] = {s: i for i, s in enumerate(RoundState)}


#: Either kind of round the round loop runs.
AnyRound = RoundMachine | GroupedRoundMachine


@runtime_checkable
class Grouped(Protocol):
    """A round in groups as its task fan-out and its privacy charge read it
    (`GroupedRoundMachine`, or any view of one with the same members): a
    round is in groups exactly when it has these; a round of one instance
    is its own only group."""

    @property
    def machines(self) -> Sequence[RoundMachine]:
        """Every group's instance, in group order."""
        ...

    def released(self) -> Sequence[RoundMachine]:
        """The groups whose sums were reconstructed (their `result` is set)."""
        ...


__all__ = ["AnyRound", "GroupSum", "Grouped", "GroupedRoundMachine", "GroupsShape", "PHASE_ORDER", "cohort_config",
           "combine_group_sums"]
