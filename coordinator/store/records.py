"""Typed records the store takes and returns (backend-independent).

Contracts shared by all records:
  * datetimes are timezone-aware and returned in UTC;
  * records are immutable; mapping fields are copied in and out, so mutating
    a returned record's dict never changes the store;
  * validation happens at construction (`InvalidRecordError`), so a bad
    record never reaches a backend.
"""

from __future__ import annotations

import copy

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Generic, TypeVar

from coordinator.store.errors import InvalidRecordError
from secagg.stages import Stage, check_mirrors_stages

#: abort_reason recorded by `mark_interrupted_rounds_aborted` (the lower-case
#: suffix of fedmask.v1.AbortReason.ABORT_REASON_COORDINATOR_RESTART).
COORDINATOR_RESTART = "coordinator_restart"


def utc_now() -> datetime:
    """The default clock of the stores."""
    return datetime.now(UTC)


def as_utc(value: datetime | None, what: str) -> datetime | None:
    """`value` converted to UTC; naive datetimes are refused."""
    if value is None:
        return None
    if value.tzinfo is None:
        raise InvalidRecordError(f"{what} must be timezone-aware, got naive {value!r}")
    return value.astimezone(UTC)


def _normalize_times(record: object, *names: str) -> None:
    for name in names:
        object.__setattr__(record, name, as_utc(getattr(record, name), name))


def sha256_hex(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


class DeviceStatus(StrEnum):
    ACTIVE = "active"
    REVOKED = "revoked"


_STAGE_BY_VALUE = {s.value: s for s in Stage}


class RoundState(StrEnum):
    """Round lifecycle. Non-terminal states name the stage in progress: one
    state per secagg `Stage` (same name and value, in protocol order; checked
    when this module is imported) between TRAINING and AGGREGATING. The
    values are what the store records. The round machine's phases
    (coordinator.rounds.PHASES) are these states from ADVERTISE_KEYS on."""

    SELECTING = "selecting"
    TRAINING = "training"
    ADVERTISE_KEYS = Stage.ADVERTISE_KEYS.value
    SHARE_KEYS = Stage.SHARE_KEYS.value
    SHARE_CHECK = Stage.SHARE_CHECK.value
    MASKED_INPUT = Stage.MASKED_INPUT.value
    CONSISTENCY_CHECK = Stage.CONSISTENCY_CHECK.value
    UNMASKING = Stage.UNMASKING.value
    AGGREGATING = "aggregating"
    COMMITTED = "committed"
    ABORTED = "aborted"

    @property
    def stage(self) -> Stage | None:
        """The secagg stage this state collects (None outside the stages)."""
        return _STAGE_BY_VALUE.get(self.value)

    @property
    def is_collecting(self) -> bool:
        """True in the states of the secagg stages."""
        return self.value in _STAGE_BY_VALUE

    @property
    def is_terminal(self) -> bool:
        return self in (RoundState.COMMITTED, RoundState.ABORTED)


check_mirrors_stages((s.value for s in RoundState), owner="RoundState")


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceRecord:
    id: int
    identity_public_key: bytes
    enrolled_at: datetime
    status: DeviceStatus
    last_seen_at: datetime | None = None
    #: The edge client's own label for the device (EnrollRequest local_id).
    local_id: str = ""
    #: Identity of the enrolling edge client (certificate CN or token name).
    client_id: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", DeviceStatus(self.status))
        _normalize_times(self, "enrolled_at", "last_seen_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class NewModelVersion:
    """A model version to store; the store assigns id, sha256 and round."""

    model_name: str
    #: Serialized global parameters (see coordinator.store.blobs).
    parameters: bytes
    hyperparameters: Mapping[str, Any] = field(default_factory=dict)
    #: Defaults to the store's clock.
    created_at: datetime | None = None

    def __post_init__(self) -> None:
        if not self.model_name:
            raise InvalidRecordError("model_name must be non-empty")
        if not isinstance(self.parameters, bytes):
            raise InvalidRecordError("parameters must be bytes")
        _normalize_times(self, "created_at")
        object.__setattr__(self, "hyperparameters", dict(self.hyperparameters))


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelVersionSummary:
    """A model version without its blob (listing)."""

    id: int
    #: The round that produced it; None for an initial/imported model.
    round_number: int | None
    created_at: datetime
    model_name: str
    sha256: str
    size_bytes: int
    hyperparameters: Mapping[str, Any]

    def __post_init__(self) -> None:
        _normalize_times(self, "created_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelVersion(ModelVersionSummary):
    """A model version with its parameter blob, verified against sha256."""

    parameters: bytes

    def summary(self) -> ModelVersionSummary:
        """This version without its blob; the hyperparameters are a deep copy
        (a caller may change them without touching this record)."""
        return ModelVersionSummary(
            id=self.id, round_number=self.round_number, created_at=self.created_at, model_name=self.model_name,
            sha256=self.sha256, size_bytes=self.size_bytes, hyperparameters=copy.deepcopy(dict(self.hyperparameters)),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundRecord:
    """One training round, as saved at every state change.

    survivors / dropouts: stage name -> device ids (ascending);
    timings: stage name -> seconds; metrics: name -> aggregated value.
    """

    number: int
    state: RoundState
    started_at: datetime
    cohort_size: int
    ended_at: datetime | None = None
    abort_reason: str | None = None
    #: The model version the round started from.
    base_model_version: int | None = None
    survivors: Mapping[str, Sequence[int]] = field(default_factory=dict)
    dropouts: Mapping[str, Sequence[int]] = field(default_factory=dict)
    timings: Mapping[str, float] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.number < 1:
            raise InvalidRecordError(f"round number must be >= 1, got {self.number}")
        if self.cohort_size < 0:
            raise InvalidRecordError(f"cohort_size must be >= 0, got {self.cohort_size}")
        object.__setattr__(self, "state", RoundState(self.state))
        _normalize_times(self, "started_at", "ended_at")
        if self.state is RoundState.ABORTED and not self.abort_reason:
            raise InvalidRecordError(f"round {self.number}: an aborted round needs an abort_reason")
        if self.state is not RoundState.ABORTED and self.abort_reason:
            raise InvalidRecordError(f"round {self.number}: abort_reason set on a {self.state} round")
        object.__setattr__(self, "survivors", {k: [int(i) for i in v] for k, v in self.survivors.items()})
        object.__setattr__(self, "dropouts", {k: [int(i) for i in v] for k, v in self.dropouts.items()})
        object.__setattr__(self, "timings", {k: float(v) for k, v in self.timings.items()})
        object.__setattr__(self, "metrics", {k: float(v) for k, v in self.metrics.items()})


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupCharge:
    """One group of a round in groups (D99) in its privacy entry: its size,
    the devices its released sum counted, and the noise multiplier that sum
    carries."""

    size: int
    counted: int
    noise_multiplier: float

    def __post_init__(self) -> None:
        if not (isinstance(self.size, int) and isinstance(self.counted, int) and 0 <= self.counted <= self.size):
            raise InvalidRecordError(f"a group's counted devices must be 0..size, got {self.counted} of {self.size}")
        z = float(self.noise_multiplier)
        if math.isnan(z) or z < 0:
            raise InvalidRecordError(f"a group's noise multiplier must be a number >= 0, got {z}")
        object.__setattr__(self, "noise_multiplier", z)

    def as_json(self) -> dict[str, Any]:
        return {"size": self.size, "counted": self.counted, "noise_multiplier": self.noise_multiplier}


@dataclass(frozen=True, slots=True, kw_only=True)
class PrivacyEntry:
    """Differential-privacy accounting of one round (from the accountant).
    A round in groups lists its groups whose sums were released (`groups`);
    the round is accounted at the least noise a group's sum carried, so no
    group's multiplier is below the entry's."""

    round_number: int
    epsilon: float
    delta: float
    noise_multiplier: float
    sampling_rate: float
    #: Privacy spent by all rounds so far, including this one.
    cumulative_epsilon: float
    groups: tuple[GroupCharge, ...] = ()

    def __post_init__(self) -> None:
        for name in ("epsilon", "delta", "noise_multiplier", "sampling_rate", "cumulative_epsilon"):
            value = float(getattr(self, name))
            if math.isnan(value) or value < 0:
                raise InvalidRecordError(f"privacy entry {name} must be a number >= 0, got {value}")
            object.__setattr__(self, name, value)
        object.__setattr__(self, "groups", tuple(self.groups))
        if any(g.noise_multiplier < self.noise_multiplier * (1 - 1e-12) for g in self.groups):
            raise InvalidRecordError("a group's sum carried less noise than its round is accounted at")
        if self.delta >= 1:
            raise InvalidRecordError(f"privacy entry delta must be < 1, got {self.delta}")
        if self.sampling_rate > 1:
            raise InvalidRecordError(f"sampling_rate must be <= 1, got {self.sampling_rate}")
        if self.cumulative_epsilon < self.epsilon:
            raise InvalidRecordError("cumulative_epsilon must be >= the round's epsilon")


@dataclass(frozen=True, slots=True, kw_only=True)
class PrivacySummary:
    """What the admin shows about the privacy budget."""

    rounds_accounted: int
    last_round: int | None
    #: cumulative_epsilon of the latest entry (0.0 when none).
    cumulative_epsilon: float
    #: delta of the latest entry (None when none).
    delta: float | None
    #: Sum of per-round epsilons: the loose basic-composition bound.
    epsilon_sum: float




#: Longest operator name / action name / outcome an audit entry keeps.
MAX_AUDIT_OPERATOR = 128
MAX_AUDIT_ACTION = 64
MAX_AUDIT_OUTCOME = 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditRecord:
    """One operator action (pause, resume, abort_round, rollback, ...):
    who did what, when, and how it ended. `details` holds the action's
    arguments and results (e.g. {"version": 3, "new_version": 7}); JSON
    values only. `outcome` is "ok", or "refused: <why>" / "failed: <why>"."""

    id: int
    at: datetime
    operator: str
    action: str
    outcome: str
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_audit_fields(self.operator, self.action, self.outcome)
        _normalize_times(self, "at")
        object.__setattr__(self, "details", dict(self.details))


def check_audit_fields(operator: str, action: str, outcome: str) -> None:
    """InvalidRecordError unless operator, action and outcome are
    non-empty and within their length limits."""
    for name, value, limit in (("operator", operator, MAX_AUDIT_OPERATOR), ("action", action, MAX_AUDIT_ACTION),
                               ("outcome", outcome, MAX_AUDIT_OUTCOME)):
        if not isinstance(value, str) or not value or len(value) > limit:
            raise InvalidRecordError(f"audit {name} must be 1..{limit} characters, got {value!r:.80}")


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a newest-first listing. Pass `next_cursor` as the next
    call's `before`; None means there is nothing older."""

    items: tuple[T, ...]
    next_cursor: int | None


#: What the store's users import (coordinator.store re-exports it); the
#: implementations also use the checks and helpers above.
__all__ = [
    "COORDINATOR_RESTART", "AuditRecord",
    "DeviceRecord", "DeviceStatus", "GroupCharge", "ModelVersion", "ModelVersionSummary",
    "NewModelVersion", "Page", "PrivacyEntry", "PrivacySummary", "RoundRecord", "RoundState", "utc_now",
]
