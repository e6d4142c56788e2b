"""What the admin service shows of the running coordinator, as protos
(fedmask.v1 admin_service.proto). Pure: values in, messages out.

    timeline = RoundTimeline()
    closed = timeline.open("share_keys", at=wall_now, deadline_in=r.deadline - clock_now)
    live_round(r, timeline, base_version=..., started_at=..., secure=True)  -> LiveRound
    stage_changed(r, timeline, closed)                                       -> StageChanged
    live_state(...)                                                          -> LiveState

Stage names are the round machine's phase values ("advertise_keys", ...),
which are also the store's round states; `STAGE` maps them to RoundStage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from coordinator.grouped_rounds import AnyRound
from coordinator.rounds import PHASES
from coordinator.store import RoundState
from fedmask_proto.v1 import admin_service_pb2 as A
from wire.round_task import seconds_to_duration


def _round_stage(phase: RoundState) -> A.RoundStage.ValueType:
    """ROUND_STAGE_<NAME> of `phase`; every phase has one (a phase the proto
    cannot name fails when this module is imported, not in a live view)."""
    try:
        return A.RoundStage.Value(f"ROUND_STAGE_{phase.name}")
    except ValueError:
        raise TypeError(f"fedmask.v1.RoundStage has no value for the round phase {phase.value!r}") from None


#: Phase value -> RoundStage, for every phase of the round machine (the
#: secagg stages, then aggregating, committed, aborted).
STAGE: dict[str, A.RoundStage.ValueType] = {p.value: _round_stage(p) for p in PHASES}


@dataclass
class StageMark:
    """One stage of a round on the wall clock."""

    phase: str
    started_at: datetime
    #: None when the stage has no deadline (aggregating, terminal).
    deadline_at: datetime | None
    #: Seconds, set when the next stage opened.
    duration: float | None = None


@dataclass
class RoundTimeline:
    """The stages a round opened, in order (fed with its phase changes)."""

    marks: list[StageMark] = field(default_factory=list)

    def open(self, phase: str, *, at: datetime, deadline_in: float | None) -> StageMark | None:
        """Stage `phase` opened at `at` (deadline `deadline_in` seconds
        later; None or infinite: none). Closes the previous stage (its
        duration) and returns it; a repeated phase opens nothing."""
        previous = self.marks[-1] if self.marks else None
        if previous is not None and previous.phase == phase:
            return None
        if previous is not None and previous.duration is None:
            previous.duration = max(0.0, (at - previous.started_at).total_seconds())
        deadline = None
        if deadline_in is not None and math.isfinite(deadline_in):
            deadline = at + timedelta(seconds=max(0.0, deadline_in))
        self.marks.append(StageMark(phase, at, deadline))
        return previous


def stage_progress(r: AnyRound, mark: StageMark, *, is_open: bool) -> A.StageProgress:
    """The progress of one stage of round `r`."""
    out = A.StageProgress(
        stage=STAGE.get(mark.phase, A.ROUND_STAGE_UNSPECIFIED),
        survivors=len(r.survivors().get(mark.phase, ())),
        dropouts=len(r.dropouts.get(mark.phase, {})),
        pending=r.pending_count if is_open else 0,
    )
    out.started_at.FromDatetime(mark.started_at)
    if is_open and mark.deadline_at is not None:
        out.deadline.FromDatetime(mark.deadline_at)
    if mark.duration is not None:
        out.duration.CopyFrom(seconds_to_duration(mark.duration))
    return out


def live_round(r: AnyRound, timeline: RoundTimeline, *, base_version: int | None, started_at: datetime,
               secure: bool) -> A.LiveRound:
    out = A.LiveRound(
        number=r.number,
        stage=STAGE.get(r.phase.value, A.ROUND_STAGE_UNSPECIFIED),
        cohort_size=len(r.cohort),
        threshold=r.config.threshold,
        neighbour_count=r.config.degree,
        live_devices=len(r.live_devices()),
        base_model_version=base_version or 0,
        secure=secure,
    )
    out.started_at.FromDatetime(started_at)
    last = len(timeline.marks) - 1
    for i, mark in enumerate(timeline.marks):
        out.stages.append(stage_progress(r, mark, is_open=i == last and r.phase.is_collecting))
    return out


def stage_changed(r: AnyRound, timeline: RoundTimeline, closed: StageMark | None) -> A.StageChanged:
    """The event of round `r` entering its current phase; `closed` is the
    stage that just closed (from `RoundTimeline.open`)."""
    out = A.StageChanged(
        round_number=r.number,
        stage=STAGE.get(r.phase.value, A.ROUND_STAGE_UNSPECIFIED),
        cohort_size=len(r.cohort),
        threshold=r.config.threshold,
        live_devices=len(r.live_devices()),
    )
    if closed is not None:
        out.closed.CopyFrom(stage_progress(r, closed, is_open=False))
    return out


def device_counts(*, enrolled: int, revoked: int, connected: int, available: int) -> A.DeviceCounts:
    return A.DeviceCounts(enrolled=enrolled, revoked=revoked, connected=connected, available=available)


def privacy_budget(*, spent: float, budget: float | None, delta: float, exhausted: bool, mode: str) -> A.PrivacyBudget:
    return A.PrivacyBudget(epsilon_spent=spent, epsilon_budget=budget or 0.0, delta=delta, exhausted=exhausted,
                           mode=mode)


def live_state(*, model_name: str, model_version: int | None, paused: bool, privacy: A.PrivacyBudget,
               devices: A.DeviceCounts, round_: A.LiveRound | None, as_of: datetime, last_sequence: int,
               committed: int, aborted: int) -> A.LiveState:
    out = A.LiveState(
        model_name=model_name,
        model_version=model_version or 0,
        paused=paused,
        budget_exhausted=privacy.exhausted,
        privacy=privacy,
        devices=devices,
        last_event_sequence=last_sequence,
        rounds_committed_since_start=committed,
        rounds_aborted_since_start=aborted,
    )
    if round_ is not None:
        out.round.CopyFrom(round_)
    out.as_of.FromDatetime(as_of)
    return out


__all__ = ["STAGE", "RoundTimeline", "StageMark", "device_counts", "live_round", "live_state", "privacy_budget",
           "stage_changed", "stage_progress"]
