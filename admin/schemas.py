"""The REST API's response bodies (pydantic), so the OpenAPI document
describes every answer. Times are ISO 8601 in UTC; durations in seconds.
Device ids appear only in operator views of a round; no response carries a
device's private data (top-k answers are computed and chosen by the device)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from coordinator.store import RoundState
from secagg.stages import Stage

Outcome = Literal["committed", "aborted", "running"]

#: The stages a round goes through while it runs, in order: every
#: secure-aggregation stage (secagg's `Stage`, protocol order), then the
#: coordinator's aggregation. The values a live round's `stage` and
#: `Federation.phase` take while a round runs; `Federation.round_stages`
#: serves them to the dashboard's stage strip.
ROUND_STAGES: tuple[str, ...] = (*(s.value for s in Stage), RoundState.AGGREGATING.value)


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    ready: bool
    store: bool = Field(description="The coordinator's store answered a read")
    coordinator: bool = Field(description="The coordinator's admin listener answered GetLiveState")
    detail: list[str] = Field(default_factory=list, description="What is not reachable, and why")


# ------------------------------------------------------------------ live


class StageProgress(BaseModel):
    stage: str = Field(description=f"{', '.join(ROUND_STAGES)}, committed or aborted")
    survivors: int
    dropouts: int
    pending: int = Field(description="Devices the open stage still waits for")
    started_at: datetime | None
    deadline: datetime | None = Field(description="When an open stage closes at the latest")
    seconds: float | None = Field(description="Duration, once the stage is closed")


class LiveRound(BaseModel):
    number: int
    stage: str
    cohort_size: int
    threshold: int = Field(description="Shamir threshold t: the round aborts when fewer devices survive")
    neighbour_count: int
    live_devices: int
    base_model_version: int
    started_at: datetime | None
    secure: bool
    stages: list[StageProgress]


class DeviceCounts(BaseModel):
    enrolled: int
    revoked: int
    connected: int
    available: int


class Budget(BaseModel):
    epsilon_spent: float
    epsilon_budget: float | None = Field(description="None when no budget is configured")
    delta: float | None
    exhausted: bool
    mode: str = Field(description="DP mode of the rounds: none, local or distributed")


class LiveState(BaseModel):
    model_name: str
    model_version: int
    paused: bool
    budget_exhausted: bool
    privacy: Budget
    devices: DeviceCounts
    round: LiveRound | None = Field(description="The running round; None between rounds")
    as_of: datetime | None
    last_event_sequence: int


class CurrentRound(BaseModel):
    round: LiveRound | None
    paused: bool
    budget_exhausted: bool
    as_of: datetime | None


# ------------------------------------------------------------- federation


class ProductionPlan(BaseModel):
    """The latest round's noise at a production-size deployment, as the planner prices it
    (`fedmask privacy plan`; dpmech.claims.production_line)."""

    population: int
    cohort: int
    rounds: int
    delta: float
    noise_multiplier: float = Field(description="The latest round's multiplier x cohort / its counted devices: the "
                                                "same noise norm in the mean update, so the same cost to the model")
    epsilon: float = Field(description="Over the rounds at delta, without amplification by sampling")
    epsilon_if_poisson: float = Field(description="Assuming cohorts are Poisson samples at cohort / population, "
                                                  "which devices cannot check")
    text: str = Field(description="The line the dashboard and the demo print")


def _protects() -> Any:
    return Field(description="The unit epsilon protects: neighbouring inputs differ in one device's data")


def _statement() -> Any:
    return Field(description="Epsilon spent with its delta, the unit it protects and whether amplification by "
                             "sampling was assumed, as one sentence; None before a round is accounted")


def _production_plan() -> Any:
    return Field(description="What the latest round's noise would give a production-size deployment; None before a "
                             "round is accounted or when its counted devices are unknown")


class ReplicaView(BaseModel):
    """One live replica of an active tier (D109), from the store."""

    name: str
    leader: bool = Field(description="It holds the leader lease: it plans the rounds and carries out "
                                     "operator actions")
    connected: int = Field(description="Device streams it holds")
    available: int = Field(description="Of them, devices available for a round")


class Federation(BaseModel):
    model_name: str | None = Field(description="None before the first model version is stored")
    current_version: int | None
    rounds_committed: int
    rounds_aborted: int
    rounds_running: int
    devices_enrolled: int
    devices_revoked: int
    devices_connected: int | None = Field(description="Over every replica of an active tier (from the store); "
                                                      "else the coordinator's own count, None when it is not "
                                                      "reachable")
    replicas: list[ReplicaView] | None = Field(default=None, description="The live replicas of an active tier, "
                                                                         "by name; None without one")
    phase: str | None = Field(description="The live round's stage, 'idle', 'paused', 'budget_exhausted', "
                                          "or None when the coordinator is not reachable")
    coordinator_reachable: bool
    epsilon_spent: float
    epsilon_budget: float | None
    delta: float | None = Field(description="Delta of epsilon_spent; None before a round is accounted")
    protects: str = _protects()
    privacy_statement: str | None = _statement()
    production_plan: ProductionPlan | None = _production_plan()
    round_stages: list[str] = Field(default_factory=lambda: list(ROUND_STAGES),
                                    description="The stages a round goes through while it runs, in order (the "
                                                "values `phase` takes then): every secure-aggregation stage, "
                                                "then aggregating")


# ----------------------------------------------------------------- rounds


class StageReport(BaseModel):
    stage: str
    survivors: int | None = Field(description="Devices that completed the stage (None: not recorded)")
    dropouts: int = Field(description="Devices that left the round at this stage")
    seconds: float | None


class RoundSummary(BaseModel):
    number: int
    state: str
    outcome: Outcome
    started_at: datetime
    ended_at: datetime | None
    seconds: float | None = Field(description="ended_at - started_at")
    cohort_size: int
    contributors: int | None = Field(description="Devices counted in the aggregate (committed rounds)")
    abort_reason: str | None
    base_model_version: int | None
    model_version: int | None = Field(description="The model version the round produced")
    epsilon: float | None = Field(description="Cumulative epsilon after the round (None without DP)")
    delta: float | None = Field(None, description="Delta of epsilon (None without DP)")
    validation: dict[str, float] = Field(description="Federated validation metrics (secure sums' means)")


class RoundDetail(RoundSummary):
    threshold: int | None = Field(description="Shamir threshold t, when recorded")
    stages: list[StageReport]
    dropout_ids: dict[str, list[int]] = Field(description="Stage -> device ids that dropped there")
    metrics: dict[str, float] = Field(description="Every aggregated metric stored with the round")
    epsilon_round: float | None = Field(description="The round's own epsilon at delta")
    noise_multiplier: float | None
    plaintext_device_ids: list[int] = Field(
        default_factory=list,
        description="FedMMF hybrid rounds: devices whose UNPROTECTED plaintext update was counted (the coordinator "
        "saw each of these updates; metrics hybrid.* count both paths); empty for every other round")


class RoundPage(BaseModel):
    items: list[RoundSummary]
    next_cursor: str | None = Field(description="Pass as ?cursor= for older rounds; None at the end")


# ----------------------------------------------------------------- models


class ModelSummary(BaseModel):
    version: int
    model_name: str
    round_number: int | None = Field(description="The round that produced it; None for an initial or imported one")
    parent_version: int | None = Field(description="The version it was trained from (lineage)")
    created_at: datetime
    sha256: str
    size_bytes: int
    hyperparameters: dict[str, object]


class ModelDetail(ModelSummary):
    lineage: list[int] = Field(description="This version, its parent, grandparent, ... (at most 50)")
    parameters_url: str = Field(description="Where to download the public global parameters (.npz)")


class ModelPage(BaseModel):
    items: list[ModelSummary]
    next_cursor: str | None


# ---------------------------------------------------------------- privacy


#: `LedgerEntry.charged` of a committed round / of a round charged as released (D94).
COMMITTED_CHARGE = "committed"
INTERRUPTED_CHARGE = "interrupted after unmasking"


class LedgerEntry(BaseModel):
    round_number: int
    noise_multiplier: float = Field(description="Effective multiplier of the round's sum")
    sampling_rate: float
    counted_devices: int | None = Field(description="Devices whose noise is in the sum")
    epsilon_round: float
    epsilon_cumulative: float
    delta: float
    unprotected_contributions: int = Field(
        0, description="Devices whose update reached the coordinator in the clear in this round (FedMMF hybrid "
                       "rounds, D64-D66): UNPROTECTED, outside epsilon and outside the secure sum's guarantee")
    charged: str = Field(
        COMMITTED_CHARGE, description="Why the round is in the ledger: 'committed' (its sum was released) or "
                                      "'interrupted after unmasking' (aborted: its coordinator died after asking the "
                                      "devices to unmask and may have learned the sum, so it is charged as released, "
                                      "D94)")
    groups: list[LedgerGroup] = Field(
        default_factory=list, description="A round in groups (D99): each group whose sum was released, with the "
                                          "noise multiplier that sum carried; the round is accounted at the least")


class LedgerGroup(BaseModel):
    size: int = Field(description="Devices the group was formed with")
    counted: int = Field(description="Devices its released sum counted")
    noise_multiplier: float = Field(description="Noise multiplier of the group's sum")


class UnprotectedRound(BaseModel):
    round_number: int
    devices: int = Field(description="Plaintext (unprotected) contributions counted in the round")


class Privacy(BaseModel):
    rounds_accounted: int
    epsilon_spent: float
    delta: float | None
    protects: str = _protects()
    amplification_by_sampling: bool = Field(description="Whether a round's epsilon assumed amplification by "
                                                        "sampling (a sampling_rate below 1)")
    statement: str | None = _statement()
    production_plan: ProductionPlan | None = _production_plan()
    epsilon_budget: float | None = Field(description="From the running coordinator; None when unknown or unset")
    epsilon_remaining: float | None
    exhausted: bool | None = Field(description="None when the coordinator is not reachable")
    ledger: list[LedgerEntry]
    unprotected_contributions_total: int = Field(
        description="Plaintext contributions over every committed round (FedMMF hybrid rounds, D64-D66), with or "
                    "without differential privacy; none of them is folded into epsilon")
    unprotected_rounds: list[UnprotectedRound] = Field(
        description="The committed rounds with plaintext contributions, ascending")


# ------------------------------------------------------------------ top-k


class RecommendedItem(BaseModel):
    """One recommended item. No score: the device's scores are its user's
    private model output and never leave it (D84); the rank is the answer."""

    item_id: str = Field(description="The dataset's own item id")
    title: str | None = Field(description="The dataset's title, when it ships one")
    rank: int = Field(ge=1, description="1-based, best first")
    item_index: int = Field(description="The model's dense item index")


class Recommendations(BaseModel):
    device_id: int
    user: str = Field(description="The handle the device registered at enrolment")
    items: list[RecommendedItem] = Field(description="At most k, by rank; fewer where the device's own cap is "
                                                     "smaller or the user has seen the rest")
    seen_excluded: bool = Field(description="Whether the device left out the items the user already interacted "
                                            "with: its policy decides, not the request's exclude_seen")
    model_version: int = Field(description="The global version the device's model was last updated from")
    computed_on: Literal["device"] = "device"
    latency_ms: float = Field(description="From the coordinator's request to the device's answer")
    total_ms: float = Field(description="As measured by the admin service, including the relay")
    recommendation_id: str


# ---------------------------------------------------------------- actions


class ActionBody(BaseModel):
    reason: str = Field("", max_length=1024, description="Why, for the audit log")


class ActionResult(BaseModel):
    action: str
    changed: bool
    audit_id: int
    new_model_version: int | None
    state: LiveState


class AuditEntry(BaseModel):
    id: int
    at: datetime
    operator: str = Field(description="Who acted (the API token's name, as the admin service passes it)")
    action: str = Field(description="pause, resume, abort_round, rollback, ...")
    outcome: str = Field(description="ok, or 'refused: <why>' / 'failed: <why>'")
    details: dict[str, object] = Field(description="The action's arguments and results")


class AuditPage(BaseModel):
    items: list[AuditEntry]
    next_cursor: str | None
