"""Pure conversions of CoordinatorAdmin answers: proto messages to the API's
bodies, AdminEvents to Server-Sent-Event frames, and gRPC failures to
problem documents."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.json_format import MessageToDict
from google.protobuf.timestamp_pb2 import Timestamp

from admin import schemas
from admin.live import LiveError
from admin.problems import ProblemError
from fedmask_proto.v1 import admin_service_pb2 as pb


def stage_name(stage: int) -> str:
    """"masked_input" for ROUND_STAGE_MASKED_INPUT; "unspecified" for 0."""
    try:
        return pb.RoundStage.Name(pb.RoundStage.ValueType(stage)).removeprefix("ROUND_STAGE_").lower()
    except ValueError:
        return f"unknown_{int(stage)}"


def _time(ts: Timestamp, present: bool) -> datetime | None:
    return ts.ToDatetime(tzinfo=UTC) if present else None


def _seconds(d: Duration) -> float:
    return d.seconds + d.nanos / 1e9


def stage_progress(s: pb.StageProgress) -> schemas.StageProgress:
    return schemas.StageProgress(
        stage=stage_name(s.stage), survivors=s.survivors, dropouts=s.dropouts, pending=s.pending,
        started_at=_time(s.started_at, s.HasField("started_at")), deadline=_time(s.deadline, s.HasField("deadline")),
        seconds=_seconds(s.duration) if s.HasField("duration") else None)


def live_round(r: pb.LiveRound) -> schemas.LiveRound:
    return schemas.LiveRound(
        number=r.number, stage=stage_name(r.stage), cohort_size=r.cohort_size, threshold=r.threshold,
        neighbour_count=r.neighbour_count, live_devices=r.live_devices, base_model_version=r.base_model_version,
        started_at=_time(r.started_at, r.HasField("started_at")), secure=r.secure,
        stages=[stage_progress(s) for s in r.stages])


def budget(p: pb.PrivacyBudget) -> schemas.Budget:
    return schemas.Budget(epsilon_spent=p.epsilon_spent,
                          epsilon_budget=p.epsilon_budget if p.epsilon_budget > 0 else None,
                          delta=p.delta if p.delta > 0 else None, exhausted=p.exhausted, mode=p.mode or "none")


def live_state(s: pb.LiveState) -> schemas.LiveState:
    d = s.devices
    return schemas.LiveState(
        model_name=s.model_name, model_version=s.model_version, paused=s.paused, budget_exhausted=s.budget_exhausted,
        privacy=budget(s.privacy),
        devices=schemas.DeviceCounts(enrolled=d.enrolled, revoked=d.revoked, connected=d.connected,
                                     available=d.available),
        round=live_round(s.round) if s.HasField("round") else None, as_of=_time(s.as_of, s.HasField("as_of")),
        last_event_sequence=s.last_event_sequence)


def current_round(s: pb.LiveState) -> schemas.CurrentRound:
    return schemas.CurrentRound(round=live_round(s.round) if s.HasField("round") else None, paused=s.paused,
                                budget_exhausted=s.budget_exhausted, as_of=_time(s.as_of, s.HasField("as_of")))


def phase(s: pb.LiveState) -> str:
    """The federation's phase in one word, for the overview."""
    if s.HasField("round"):
        return stage_name(s.round.stage)
    if s.budget_exhausted:
        return "budget_exhausted"
    if s.paused:
        return "paused"
    return "idle"


def recommendations(r: pb.RecommendTopKResponse, *, total_ms: float) -> schemas.Recommendations:
    """The API's answer: ranks, never a score, even should a coordinator send one (D84)."""
    return schemas.Recommendations(
        device_id=r.device_id, user=r.user_handle,
        items=[schemas.RecommendedItem(item_id=i.item_id, title=i.title or None, rank=max(i.rank, 1),
                                       item_index=i.item_index) for i in r.items],
        seen_excluded=r.seen_excluded,
        model_version=r.model_version, latency_ms=_seconds(r.latency) * 1000.0, total_ms=total_ms,
        recommendation_id=r.recommendation_id)


def action_result(action: str, r: pb.OperatorActionResponse) -> schemas.ActionResult:
    return schemas.ActionResult(action=action, changed=r.changed, audit_id=r.audit_id,
                                new_model_version=r.new_model_version or None, state=live_state(r.state))


#: The SSE event name of each AdminEvent case.
_EVENT_NAMES = {"snapshot": "snapshot", "stage_changed": "stage", "round_committed": "committed",
                "round_aborted": "aborted", "device_counts": "devices", "federation_changed": "federation"}


def sse_frame(event: pb.AdminEvent) -> str:
    """One Server-Sent-Events frame: `id` the coordinator's sequence, `event`
    the kind (snapshot, stage, committed, aborted, devices, federation),
    `data` its JSON (stage names in the store's spelling)."""
    kind = event.WhichOneof("event") or "unknown"
    body: dict[str, Any] = MessageToDict(getattr(event, kind), preserving_proto_field_name=True,
                                         always_print_fields_with_no_presence=True) if kind != "unknown" else {}
    body = _stage_names(body)
    body["sequence"] = event.sequence
    if event.HasField("at"):
        body["at"] = event.at.ToDatetime(tzinfo=UTC).isoformat()
    data = json.dumps(body, separators=(",", ":"), sort_keys=True)
    return f"id: {event.sequence}\nevent: {_EVENT_NAMES.get(kind, kind)}\ndata: {data}\n\n"


def _stage_names(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: (v.removeprefix("ROUND_STAGE_").lower() if k == "stage" and isinstance(v, str) else
                    v.removeprefix("ABORT_REASON_").lower() if k == "reason" and isinstance(v, str) else
                    _stage_names(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_stage_names(v) for v in value]
    return value


#: The admin listener's gRPC status -> the HTTP status of the problem
#: document (the one translation of a coordinator failure in the admin
#: service; the coordinator's own is coordinator/status_codes.py). A status
#: not listed is 502.
HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.INVALID_ARGUMENT: 422,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 503,
    grpc.StatusCode.INTERNAL: 502,
}


def problem_for(exc: LiveError, *, what: str, retry_after_s: int) -> ProblemError:
    """The problem document of a failed CoordinatorAdmin call. The
    coordinator's refusal of the admin service's OWN credential
    (UNAUTHENTICATED) is a 502: the client's token was fine."""
    if exc.code is grpc.StatusCode.UNAUTHENTICATED:
        return ProblemError(502, f"{what}: the coordinator refused the admin service's credential")
    status = HTTP_STATUS.get(exc.code, 502)
    headers: dict[str, str] = {}
    if status == 503:
        wait = retry_after_s if exc.retry_after_ms is None else max(1, math.ceil(exc.retry_after_ms / 1000))
        headers["Retry-After"] = str(wait)
    detail = f"{what}: {exc.detail}" if exc.detail else what
    return ProblemError(status, detail, headers=headers)


def coordinator_unreachable(exc: LiveError, *, retry_after_s: int) -> ProblemError:
    return ProblemError(503, f"the coordinator's admin listener is not reachable ({exc.code.name})",
                        headers={"Retry-After": str(retry_after_s)})


def replica_views(counts: dict[str, tuple[int, int]], leader: str | None) -> list[schemas.ReplicaView] | None:
    """The live replicas of an active tier from the store's stream counts
    (name -> (held, available)) and the leader lease's holder; None when no
    replica is live (a single coordinator or the standby mode)."""
    if not counts:
        return None
    return [schemas.ReplicaView(name=name, leader=name == leader, connected=held, available=available)
            for name, (held, available) in sorted(counts.items())]
