"""Records of a round run in groups by a tier of replicas: the round's plan
(written by the leader), its groups (one row per group, naming the replica
and membership term that runs it), each group's progress and result (its
unmasked sum), and the rule of the group state machine.

A group's state only moves forward:

    assigned -> running -> unmasking -> done
         \\          \\          \\-----> failed | lost
          \\          \\---------------> failed | lost
           \\------------------------> failed | lost

`done`, `failed` and `lost` are final. A group is `done` only from
`unmasking` (no sum is reconstructed before anyone is asked to unmask),
and a group is in `unmasking` only with the devices asked to unmask saved
(`asked`), before any of them is asked (D94). `lost` is written by the
leader (`close_groups`, or the sealing of a terminal round) and keeps the
state the group was in (`lost_in`): a group lost in `unmasking` may have
released its sum, and its asked devices may have spent their contribution;
so may a group that failed after its asked devices were saved (its row does
not say whether it held enough answers).

A group's sum (the encoded unmasked sum, metric limbs included, and the
metric limbs apart) is what the server learns of the group (D34/D87/D99);
the store keeps it only while its round runs: sealing the round deletes
it. Every rule here is shared by the SQL and the in-memory store.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt

from coordinator.store.errors import ConflictError, InvalidRecordError
from coordinator.store.records import PrivacyEntry, RoundRecord, RoundState, as_utc

__all__ = ["ChargeRule", "EncodedSum", "GroupAssignment", "GroupClosed", "GroupProgress", "GroupResult", "GroupRow",
           "GroupState", "RoundOutcome", "RoundPlan"]

#: Longest phase name, failure reason, and state name a group row keeps.
MAX_PHASE_CHARS = 32
MAX_REASON_CHARS = 64
_MAX_BIGINT = 2**63 - 1
_U32 = np.dtype("<u4")


class GroupClosed(ConflictError):
    """A replica's write to a group that no longer takes it: the group is
    final (done, failed, lost), its round is terminal, the group names
    another replica or membership term, or the write would move its state
    backwards. Nothing was written."""


class GroupState(StrEnum):
    ASSIGNED = "assigned"
    RUNNING = "running"
    UNMASKING = "unmasking"
    DONE = "done"
    FAILED = "failed"
    LOST = "lost"

    @property
    def is_final(self) -> bool:
        return self in (GroupState.DONE, GroupState.FAILED, GroupState.LOST)

    @property
    def rank(self) -> int:
        """Order of the open states (assigned 0, running 1, unmasking 2); final states 3."""
        return {GroupState.ASSIGNED: 0, GroupState.RUNNING: 1, GroupState.UNMASKING: 2}.get(self, 3)


OPEN_STATES = (GroupState.ASSIGNED.value, GroupState.RUNNING.value, GroupState.UNMASKING.value)
#: The states of a group whose devices may have been asked to unmask.
ASKED_STATES = (GroupState.UNMASKING, GroupState.DONE)


# ------------------------------------------------------------------ checks
def _int(value: object, what: str, *, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not low <= int(value) <= _MAX_BIGINT:
        raise InvalidRecordError(f"{what} must be an integer in {low}..2^63-1, got {value!r:.40}")
    return int(value)


def _text(value: object, what: str, longest: int) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= longest:
        raise InvalidRecordError(f"{what} must be 1 to {longest} characters, got {value!r:.40}")
    return value


def _blob(value: object, what: str, *, empty: bool = False) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview) or (not empty and len(value) == 0):
        raise InvalidRecordError(f"{what} must be {'' if empty else 'non-empty '}bytes")
    return bytes(value)


def _json(value: object, what: str) -> Any:
    """A deep copy of a JSON value (no NaN, string keys), or InvalidRecordError."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidRecordError(f"{what} must be JSON values: {exc}") from None


def _ids(values: Iterable[object], what: str) -> tuple[int, ...]:
    """Distinct device ids (>= 1), ascending."""
    ids = [_int(v, what, low=1) for v in values]
    if len(set(ids)) != len(ids):
        raise InvalidRecordError(f"{what} names a device twice")
    return tuple(sorted(ids))


def _subset(ids: Iterable[int], members: frozenset[int], what: str) -> None:
    if stray := sorted(set(ids) - members):
        raise InvalidRecordError(f"{what} names devices {stray[:8]} that are not members of the group")


def _stage_ids(value: Mapping[str, Iterable[int]], what: str) -> dict[str, tuple[int, ...]]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise InvalidRecordError(f"{what} maps stage names to device ids")
    return {k: _ids(v, what) for k, v in value.items()}


def _seconds(value: Mapping[str, float], what: str) -> dict[str, float]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise InvalidRecordError(f"{what} maps names to seconds")
    out = {k: float(v) for k, v in value.items()}
    if any(not np.isfinite(v) or v < 0 for v in out.values()):
        raise InvalidRecordError(f"{what} must be finite numbers >= 0")
    return out


def _pairs(value: Iterable[Sequence[int]], what: str) -> tuple[tuple[int, int], ...]:
    out = []
    for pair in value:
        if len(pair) != 2:
            raise InvalidRecordError(f"{what} are (reporter, reported) pairs")
        out.append((_int(pair[0], what, low=1), _int(pair[1], what, low=1)))
    return tuple(sorted(out))


# ------------------------------------------------------------------ records
@dataclass(frozen=True, slots=True, kw_only=True)
class RoundPlan:
    """What the leader decided for a round in groups, before any group runs:
    its nonce, the model (name, version, step) and hyperparameters, the
    metric names, the cohort (`cohort_size` devices over all groups, at
    least `minimum` of them counted for a commit), the key of the rotation
    (D99), the stage deadlines (stage -> seconds) and the training tasks'
    (name -> seconds), when it opened and must close (aware UTC), and the
    devices left out of the groups (`devices_left_out` of them; `left_out`
    a JSON object saying which and why). `lease_token` is the leader's
    lease token when it planned. `new_model_version` is set by the store
    when the round commits (None before and for an aborted round)."""

    round_number: int
    lease_token: int
    nonce: bytes
    model_name: str
    model_version: int
    step: int
    hyperparameters: Mapping[str, Any]
    metric_names: tuple[str, ...]
    cohort_size: int
    minimum: int
    rotation_key: bytes
    deadlines: Mapping[str, float]
    task_deadlines: Mapping[str, float]
    opened_at: datetime
    closes_at: datetime
    devices_left_out: int = 0
    left_out: Mapping[str, Any] = field(default_factory=dict)
    new_model_version: int | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        _int(self.round_number, "round_number", low=1)
        _int(self.lease_token, "lease_token", low=1)
        set_(self, "nonce", _blob(self.nonce, "nonce"))
        _text(self.model_name, "model_name", 255)
        _int(self.model_version, "model_version", low=1)
        _int(self.step, "step")
        set_(self, "hyperparameters", _json(dict(self.hyperparameters), "hyperparameters"))
        names = tuple(self.metric_names)
        if len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
            raise InvalidRecordError("metric_names must be distinct non-empty strings")
        set_(self, "metric_names", names)
        _int(self.cohort_size, "cohort_size", low=1)
        if not 1 <= _int(self.minimum, "minimum", low=1) <= self.cohort_size:
            raise InvalidRecordError(f"minimum must be 1..cohort_size, got {self.minimum} of {self.cohort_size}")
        set_(self, "rotation_key", _blob(self.rotation_key, "rotation_key"))
        set_(self, "deadlines", _seconds(self.deadlines, "deadlines"))
        set_(self, "task_deadlines", _seconds(self.task_deadlines, "task_deadlines"))
        set_(self, "opened_at", as_utc(self.opened_at, "opened_at"))
        set_(self, "closes_at", as_utc(self.closes_at, "closes_at"))
        if self.closes_at < self.opened_at:
            raise InvalidRecordError("a round plan closes before it opens")
        _int(self.devices_left_out, "devices_left_out")
        if not isinstance(self.left_out, Mapping):
            raise InvalidRecordError("left_out must be a JSON object")
        set_(self, "left_out", _json(dict(self.left_out), "left_out"))
        if self.new_model_version is not None:
            _int(self.new_model_version, "new_model_version", low=1)


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupAssignment:
    """Group `index` (0, 1, ...) of round `round_number`: its member devices
    (ascending), the replica and membership term (`replica_token`) that
    runs it, and its opaque settings as the replica reads them back
    (`secagg_settings`, the secagg `session_id`, `dp_settings` or None
    without DP)."""

    round_number: int
    index: int
    replica: str
    replica_token: int
    members: tuple[int, ...]
    secagg_settings: bytes
    session_id: bytes
    dp_settings: bytes | None = None

    def __post_init__(self) -> None:
        _int(self.round_number, "round_number", low=1)
        _int(self.index, "group index")
        _text(self.replica, "replica", 255)
        _int(self.replica_token, "replica_token", low=1)
        members = _ids(self.members, "members")
        if not members:
            raise InvalidRecordError(f"group {self.index} has no members")
        object.__setattr__(self, "members", members)
        object.__setattr__(self, "secagg_settings", _blob(self.secagg_settings, "secagg_settings"))
        object.__setattr__(self, "session_id", _blob(self.session_id, "session_id"))
        if self.dp_settings is not None:
            object.__setattr__(self, "dp_settings", _blob(self.dp_settings, "dp_settings"))


@dataclass(frozen=True, slots=True, eq=False)
class EncodedSum:
    """A group's unmasked sum: `encoded_sum` uint32 (vector_length,), the
    whole sum mod 2^w with the metric limbs included, and `metric_limbs`
    uint32 (metric_coordinates,), the metric limbs' sums undecoded. Given
    as uint32 arrays or their little-endian bytes; held as read-only
    arrays; `vector_length` and `metric_coordinates` must be their lengths
    (metric_coordinates <= vector_length). Equal when bit for bit equal."""

    encoded_sum: npt.NDArray[np.uint32]
    metric_limbs: npt.NDArray[np.uint32]
    vector_length: int
    metric_coordinates: int

    def __post_init__(self) -> None:
        for name, length in (("encoded_sum", self.vector_length), ("metric_limbs", self.metric_coordinates)):
            array = _u32(getattr(self, name), name)
            if array.shape != (_int(length, f"{name}'s stated length"),):
                raise InvalidRecordError(f"{name} has {array.size} coordinates, stated {length}")
            object.__setattr__(self, name, array)
        if self.metric_coordinates > self.vector_length:
            raise InvalidRecordError("a sum cannot hold more metric limbs than coordinates")

    @property
    def sha256(self) -> str:
        """Of the encoded sum's bytes followed by the metric limbs'."""
        return sum_digest(self.encoded_sum.tobytes(), self.metric_limbs.tobytes())

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, EncodedSum) and self.encoded_sum.tobytes() == other.encoded_sum.tobytes()
                and self.metric_limbs.tobytes() == other.metric_limbs.tobytes()
                and self.vector_length == other.vector_length)

    def __hash__(self) -> int:
        return hash(self.sha256)


def _u32(value: object, what: str) -> npt.NDArray[np.uint32]:
    if isinstance(value, bytes | bytearray | memoryview):
        if len(value) % 4:
            raise InvalidRecordError(f"{what}: {len(value)} bytes are not whole uint32 coordinates")
        array = np.frombuffer(bytes(value), dtype=_U32).astype(np.uint32)
    elif isinstance(value, np.ndarray) and value.dtype == np.uint32 and value.ndim == 1:
        array = value.copy()
    else:
        raise InvalidRecordError(f"{what} must be a 1-d uint32 array or its bytes")
    array.flags.writeable = False
    return array


def sum_digest(encoded: bytes, limbs: bytes) -> str:
    return hashlib.sha256(encoded + limbs).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupProgress:
    """A running group's stage change, as its replica saves it: the state
    (`running` or `unmasking`), the group machine's phase, the devices
    asked to unmask (required in `unmasking`, before any is asked; None
    before), survivors and dropouts (stage -> device ids), timings (stage
    -> seconds), share-check reports ((reporter, reported) pairs) and the
    share check's survivors. Every id must be a member of the group."""

    round_number: int
    index: int
    state: GroupState
    phase: str
    asked: tuple[int, ...] | None = None
    survivors: Mapping[str, Sequence[int]] = field(default_factory=dict)
    dropouts: Mapping[str, Sequence[int]] = field(default_factory=dict)
    timings: Mapping[str, float] = field(default_factory=dict)
    share_reports: tuple[tuple[int, int], ...] = ()
    share_check_survivors: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _int(self.round_number, "round_number", low=1)
        _int(self.index, "group index")
        state = GroupState(self.state)
        if state not in (GroupState.RUNNING, GroupState.UNMASKING):
            raise InvalidRecordError(f"progress is saved in state running or unmasking, not {state}")
        if state is GroupState.UNMASKING and not self.asked:
            raise InvalidRecordError("a group enters unmasking only with the devices it asks saved (D94)")
        _set_progress_fields(self, state)


def _set_progress_fields(record: GroupProgress | GroupResult, state: GroupState) -> None:
    set_ = object.__setattr__
    set_(record, "state", state)
    if record.phase is not None:
        _text(record.phase, "phase", MAX_PHASE_CHARS)
    if isinstance(record, GroupProgress) and record.asked is not None:
        set_(record, "asked", _ids(record.asked, "asked"))
    set_(record, "survivors", _stage_ids(record.survivors, "survivors"))
    set_(record, "dropouts", _stage_ids(record.dropouts, "dropouts"))
    set_(record, "timings", _seconds(record.timings, "timings"))
    set_(record, "share_reports", _pairs(record.share_reports, "share_reports"))
    set_(record, "share_check_survivors", _ids(record.share_check_survivors, "share_check_survivors"))


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupResult:
    """How a group ended, as its replica writes it: `done` with its sum
    (`sum`) and the devices counted in it (`counted`, non-empty), or
    `failed` with a reason (`fail_reason`, 1 to 64 characters) and no sum.
    The other fields are a last `GroupProgress`'s; `completion` is a JSON
    object of the group machine's closing figures; `phase` None keeps the
    stored phase."""

    round_number: int
    index: int
    state: GroupState
    sum: EncodedSum | None = None
    counted: tuple[int, ...] = ()
    fail_reason: str | None = None
    phase: str | None = None
    survivors: Mapping[str, Sequence[int]] = field(default_factory=dict)
    dropouts: Mapping[str, Sequence[int]] = field(default_factory=dict)
    timings: Mapping[str, float] = field(default_factory=dict)
    completion: Mapping[str, Any] = field(default_factory=dict)
    share_reports: tuple[tuple[int, int], ...] = ()
    share_check_survivors: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _int(self.round_number, "round_number", low=1)
        _int(self.index, "group index")
        state = GroupState(self.state)
        if state is GroupState.DONE:
            if not isinstance(self.sum, EncodedSum) or not self.counted or self.fail_reason is not None:
                raise InvalidRecordError("a done group has a sum, counted devices and no failure reason")
        elif state is GroupState.FAILED:
            if self.sum is not None:
                raise InvalidRecordError("a failed group has no sum")
            _text(self.fail_reason, "fail_reason", MAX_REASON_CHARS)
        else:
            raise InvalidRecordError(f"a group finishes done or failed, not {state}")
        object.__setattr__(self, "counted", _ids(self.counted, "counted"))
        if not isinstance(self.completion, Mapping):
            raise InvalidRecordError("completion must be a JSON object")
        object.__setattr__(self, "completion", _json(dict(self.completion), "completion"))
        _set_progress_fields(self, state)


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupRow:
    """A stored group: its assignment, its state (and `lost_in`, the state
    it was in when it was lost), and what its replica last saved.
    `updated_at` is seconds by the store's clock (the database's epoch
    seconds on SQL). `sum` is read only when asked for (and only while the
    round runs: sealing deletes it)."""

    assignment: GroupAssignment
    state: GroupState
    lost_in: GroupState | None
    phase: str
    asked: tuple[int, ...] | None
    survivors: Mapping[str, tuple[int, ...]]
    dropouts: Mapping[str, tuple[int, ...]]
    timings: Mapping[str, float]
    completion: Mapping[str, Any]
    counted: tuple[int, ...] | None
    share_reports: tuple[tuple[int, int], ...]
    share_check_survivors: tuple[int, ...]
    fail_reason: str | None
    updated_at: float
    sum: EncodedSum | None = None

    @property
    def round_number(self) -> int:
        return self.assignment.round_number

    @property
    def index(self) -> int:
        return self.assignment.index

    @property
    def may_have_asked(self) -> bool:
        """Whether devices of this group may have been asked to unmask (and
        so may have spent their contribution, and its sum may be known): in
        `unmasking` or `done`, lost in `unmasking`, or any group whose asked
        devices were saved, a failed one included (a group that failed after
        asking may have held enough answers; its row does not say, so it
        counts as released)."""
        return self.state in ASKED_STATES or self.lost_in is GroupState.UNMASKING or bool(self.asked)


@dataclass(frozen=True, slots=True)
class RoundOutcome:
    """How a round stands, for replicas waiting on the leader: its state,
    the model version its commit produced (None unless committed), its
    abort reason (None unless aborted)."""

    state: RoundState
    new_model_version: int | None
    abort_reason: str | None


# ------------------------------------------------------------------ rules
def new_group_row(a: GroupAssignment, now: float) -> GroupRow:
    """The row of a group as the plan writes it: assigned, nothing saved."""
    return GroupRow(assignment=a, state=GroupState.ASSIGNED, lost_in=None, phase=GroupState.ASSIGNED.value,
                    asked=None, survivors={}, dropouts={}, timings={}, completion={}, counted=None,
                    share_reports=(), share_check_survivors=(), fail_reason=None, updated_at=now)


def check_round_groups(plan: RoundPlan, groups: Sequence[GroupAssignment], number: int,
                       lease_token: int | None) -> tuple[GroupAssignment, ...]:
    """`open_planned_round`'s arguments, checked: the plan and every group
    are of round `number`; the groups are 0..n-1 (n >= 1), their members
    disjoint and `plan.cohort_size` in all; the plan's lease token is the
    fence's (when one is given). Returns the groups by index."""
    if plan.round_number != number or any(g.round_number != number for g in groups):
        raise InvalidRecordError(f"the plan and every group must be of round {number}")
    ordered = tuple(sorted(groups, key=lambda g: g.index))
    if not ordered or [g.index for g in ordered] != list(range(len(ordered))):
        raise InvalidRecordError("a round's groups are numbered 0..n-1, each once, n >= 1")
    members = [d for g in ordered for d in g.members]
    if len(set(members)) != len(members):
        raise InvalidRecordError("a device is a member of two groups")
    if len(members) != plan.cohort_size:
        raise InvalidRecordError(f"the groups hold {len(members)} devices, the plan's cohort is {plan.cohort_size}")
    if lease_token is not None and plan.lease_token != lease_token:
        raise InvalidRecordError(f"the plan names lease token {plan.lease_token}, the fence {lease_token}")
    return ordered


def check_write(row: GroupRow, state: GroupState) -> None:
    """A replica's write moving `row` to `state` (the membership and round
    already checked): GroupClosed unless the row is open and `state` does
    not move it backwards; `done` only from `unmasking`."""
    where = f"group {row.index} of round {row.round_number}"
    if row.state.is_final:
        raise GroupClosed(f"{where} is {row.state}")
    if state.rank < row.state.rank:
        raise GroupClosed(f"{where} is {row.state}: it cannot go back to {state}")
    if state is GroupState.DONE and row.state is not GroupState.UNMASKING:
        raise GroupClosed(f"{where} is {row.state}: a group is done only after unmasking")


def check_member_ids(row: GroupRow, record: GroupProgress | GroupResult) -> None:
    """Every device `record` names is a member of the group; the devices
    asked to unmask include every one asked before (none is forgotten)."""
    members = frozenset(row.assignment.members)
    named: list[tuple[str, Iterable[int]]] = [
        ("counted" if isinstance(record, GroupResult) else "asked",
         record.counted if isinstance(record, GroupResult) else record.asked or ()),
        ("share_check_survivors", record.share_check_survivors),
        ("share_reports", [d for pair in record.share_reports for d in pair])]
    named += [(f"survivors[{k}]", v) for k, v in record.survivors.items()]
    named += [(f"dropouts[{k}]", v) for k, v in record.dropouts.items()]
    for what, ids in named:
        _subset(ids, members, what)
    if isinstance(record, GroupProgress) and row.asked and not set(row.asked) <= set(record.asked or ()):
        raise GroupClosed(f"group {row.index}: the devices asked to unmask only grow")


def progressed(row: GroupRow, p: GroupProgress, now: float) -> GroupRow:
    """`row` after progress `p` (checked)."""
    return _replace(row, state=p.state, phase=p.phase, asked=p.asked, survivors=p.survivors, dropouts=p.dropouts,
                    timings=p.timings, share_reports=p.share_reports, share_check_survivors=p.share_check_survivors,
                    updated_at=now)


def finished(row: GroupRow, r: GroupResult, now: float) -> GroupRow:
    """`row` after result `r` (checked); its sum is `r.sum`."""
    return _replace(row, state=r.state, phase=r.phase or row.phase, survivors=r.survivors, dropouts=r.dropouts,
                    timings=r.timings, completion=r.completion, counted=r.counted if r.sum else None,
                    share_reports=r.share_reports, share_check_survivors=r.share_check_survivors,
                    fail_reason=r.fail_reason, updated_at=now, sum=r.sum)


def lost(row: GroupRow, now: float) -> GroupRow:
    """An open `row` closed by the leader: lost, remembering its state."""
    return _replace(row, state=GroupState.LOST, lost_in=row.state, updated_at=now)


def _replace(row: GroupRow, **changes: Any) -> GroupRow:
    fields = {name: getattr(row, name) for name in GroupRow.__dataclass_fields__}
    return GroupRow(**{**fields, **changes})


def merged_unmasking(survivors: Mapping[str, Sequence[int]], groups: Iterable[GroupRow]) -> dict[str, list[int]]:
    """A round record's survivors with the devices every group may have
    asked to unmask (`may_have_asked`) added to `survivors["unmasking"]`
    (ascending), so the spent-device rules count them."""
    out = {k: list(v) for k, v in survivors.items()}
    asked = {d for g in groups if g.may_have_asked for d in g.asked or ()}
    if asked:
        key = RoundState.UNMASKING.value
        out[key] = sorted(asked | set(out.get(key, ())))
    return out


#: `Store.mark_interrupted_rounds_aborted`'s charge rule: (the round as
#: found, the ledger so far, the round's group rows as sealed: empty for a
#: round without a plan) -> the round's privacy entry, or None (D94).
ChargeRule = Callable[[RoundRecord, Sequence[PrivacyEntry], Sequence[GroupRow]], PrivacyEntry | None]
