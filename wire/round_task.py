"""RoundTask <-> the values both sides compute from it.

The coordinator resolves its policy once with `SecAggConfig.create(...)` and
sends the resolved values (`secagg_settings_to_proto`); every device then
rebuilds the IDENTICAL config with `secagg_config_from_proto`:

    num_clients   = cohort_size
    vector_length = vector_length
    session_id    = RoundTask.session_id
    degree        = cohort_size - 1 if graph == FULL else neighbour_count
    threshold     = threshold
    encoding      = FixedPointEncoding.for_cohort(N, clip=clip, modulus_bits=modulus_bits)
                    .for_group(n), N = encoding_cohort_size or n (fedmask.v1.3:
                    a group of a round in groups encodes at the whole
                    cohort's scale, D87/D99; N < n is refused)
    active_adversary = signatures (== consistency_check; secagg runs the
                       consistency stage exactly in active mode)

(`for_cohort` with explicit modulus_bits gives max_level = (2^w - 1) // n,
the same value `create` computes with any precision, so the encoding is
equal field for field.)

`parse_round_task` checks a whole task on the device side: settings, ids
(1-based Participant.secagg_id, see wire.ids), that every assignment's
neighbours are exactly its neighbours in `config.graph(round_number)`, the
deadlines, the JSON hyper-parameters, the parameter tensors and, for the
discrete Gaussian, the mechanism it rebuilds (`wire.dp_task`, D88).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from google.protobuf import duration_pb2

from dpmech.mechanism import MechanismConfig
from dpmech.removable_encoding import RemovableNoise
from fedmask_proto.v1 import common_pb2, session_pb2
from secagg.config import SecAggConfig
from secagg.encoding import FixedPointEncoding
from secagg.errors import SecAggConfigError
from secagg.stages import Stage
from wire.dp_task import rotation_seed, task_mechanism, task_removable
from wire.errors import WireError
from wire.ids import RoundIds
from wire.round_metrics import EMPTY_LAYOUT, MetricLayout
from wire.tensors import params_from_proto, params_to_proto

MAX_HYPERPARAMETERS_CHARS = 64 * 1024
MAX_MODEL_NAME_CHARS = 64
#: The stages a deadline is given for (StageDeadlines' fields): every secagg
#: stage, by value, in protocol order.
STAGES: tuple[str, ...] = tuple(s.value for s in Stage)


def encoding_cohort_size(config: SecAggConfig) -> int:
    """The cohort size N the config's encoding is sized for: n for a round of
    one instance; for a group of a round in groups (D87), the largest N with
    max_level = (2^w - 1) // N, which rebuilds the same encoding. WireError
    for an encoding no cohort size gives (it could not be sent)."""
    enc = config.encoding
    n = config.num_clients
    if enc == FixedPointEncoding.for_cohort(n, clip=enc.clip, modulus_bits=enc.modulus_bits):
        return n
    total = ((1 << enc.modulus_bits) - 1) // enc.max_level
    try:
        rebuilt = FixedPointEncoding.for_cohort(total, clip=enc.clip, modulus_bits=enc.modulus_bits).for_group(n)
    except (SecAggConfigError, ValueError):
        rebuilt = None
    if total < n or rebuilt != enc:
        raise WireError(f"the encoding of this {n}-device instance (max_level {enc.max_level}, w {enc.modulus_bits}) "
                        "is not one a cohort size gives: it cannot be sent")
    return total


def secagg_settings_to_proto(config: SecAggConfig) -> session_pb2.SecaggSettings:
    """The settings a device rebuilds `config` from (see the module doc),
    a group's config (its encoding sized for the whole cohort) included."""
    return session_pb2.SecaggSettings(
        threshold=config.threshold,
        graph=session_pb2.GRAPH_KIND_FULL if config.is_complete_graph else session_pb2.GRAPH_KIND_SPARSE,
        neighbour_count=config.degree,
        modulus_bits=config.encoding.modulus_bits,
        clip=float(config.encoding.clip),
        cohort_size=config.num_clients,
        vector_length=config.vector_length,
        signatures=config.active_adversary,
        consistency_check=config.active_adversary,
        encoding_cohort_size=encoding_cohort_size(config),
        removable_noise=config.removable_noise,
    )


def secagg_config_from_proto(s: session_pb2.SecaggSettings, session_id: bytes) -> SecAggConfig:
    """The SecAggConfig the coordinator built (see the module doc)."""
    n = s.cohort_size
    if s.graph == session_pb2.GRAPH_KIND_FULL:
        degree = n - 1
        if s.neighbour_count not in (0, n - 1):
            raise WireError(f"SecaggSettings: full graph with neighbour_count {s.neighbour_count} != cohort_size - 1")
    elif s.graph == session_pb2.GRAPH_KIND_SPARSE:
        degree = s.neighbour_count
    else:
        raise WireError(f"SecaggSettings: graph kind {s.graph} is unspecified or unknown")
    if s.signatures != s.consistency_check:
        raise WireError("SecaggSettings: signatures and consistency_check must be both on (active mode) or both off")
    if not (math.isfinite(s.clip) and s.clip > 0):
        raise WireError(f"SecaggSettings: clip must be a positive number, got {s.clip}")
    whole = s.encoding_cohort_size or n
    if whole < n:  # a smaller N would let the groups' sums wrap
        raise WireError(f"SecaggSettings: encoding_cohort_size {whole} is below cohort_size {n}")
    try:
        encoding = FixedPointEncoding.for_cohort(whole, clip=s.clip, modulus_bits=s.modulus_bits)
        if whole != n:
            encoding = encoding.for_group(n)
        return SecAggConfig(n, s.vector_length, bytes(session_id), degree, s.threshold, encoding, bool(s.signatures),
                            bool(s.removable_noise))
    except (SecAggConfigError, ValueError, TypeError) as exc:
        raise WireError(f"SecaggSettings: {exc}") from None


def duration_to_seconds(d: duration_pb2.Duration) -> float:
    return d.seconds + d.nanos / 1e9


def seconds_to_duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(round(seconds * 1e9)))
    return d


def deadlines_to_proto(deadlines: Mapping[str, float]) -> session_pb2.StageDeadlines:
    """{stage: seconds} (keys of STAGES) -> StageDeadlines."""
    unknown = set(deadlines) - set(STAGES)
    if unknown:
        raise WireError(f"unknown stages in deadlines: {sorted(unknown)}")
    return session_pb2.StageDeadlines(**{k: seconds_to_duration(v) for k, v in deadlines.items()})


def deadlines_from_proto(d: session_pb2.StageDeadlines) -> dict[str, float]:
    """StageDeadlines -> {stage: seconds} for the stages it sets (every field
    of StageDeadlines is named after a stage of STAGES)."""
    out: dict[str, float] = {}
    for fd, value in d.ListFields():  # the fields that are set, in field order
        sec = duration_to_seconds(value)
        if sec < 0:
            raise WireError(f"StageDeadlines.{fd.name} is negative")
        out[fd.name] = sec
    return out


def participants_for(ids: RoundIds, device_ids: Iterable[int]) -> list[session_pb2.Participant]:
    return [session_pb2.Participant(device_id=d, secagg_id=ids.proto_secagg_id(d)) for d in device_ids]


def build_round_task(
    *,
    config: SecAggConfig,
    round_number: int,
    ids: RoundIds,
    devices: Sequence[int],
    model_name: str,
    model_version: int,
    global_parameters: common_pb2.ModelParameters | Mapping[str, np.ndarray],
    hyperparameters: Mapping[str, Any] | None = None,
    dp: session_pb2.DpSettings | None = None,
    deadlines: Mapping[str, float] | None = None,
    metrics: MetricLayout = EMPTY_LAYOUT,
) -> session_pb2.RoundTask:
    """Coordinator side: the RoundTask for one client hosting `devices` (a
    subset of the cohort). Assignments list each device's neighbours in
    `config.graph(round_number)`. Pass `global_parameters` already encoded
    (ModelParameters) to encode once for every client of the round.
    `metrics`: the metric coordinates every device appends (its
    `coordinates` are part of `config.vector_length`)."""
    graph = config.graph(round_number)
    if isinstance(global_parameters, common_pb2.ModelParameters):
        params = global_parameters
    else:
        params = params_to_proto(global_parameters)
    task = session_pb2.RoundTask(
        session_id=config.session_id,
        round_number=round_number,
        model_name=model_name,
        model_version=model_version,
        hyperparameters_json=json.dumps(dict(hyperparameters or {}), sort_keys=True),
        secagg=secagg_settings_to_proto(config),
        dp=dp or session_pb2.DpSettings(mode=session_pb2.DP_MODE_NONE),
        deadlines=deadlines_to_proto(deadlines or {}),
        metric_names=list(metrics.names),
    )
    task.global_parameters.CopyFrom(params)
    for d in devices:
        v = ids.secagg(d)
        task.assignments.add(
            self=session_pb2.Participant(device_id=d, secagg_id=v + 1),
            neighbours=[
                session_pb2.Participant(device_id=ids.device(u), secagg_id=u + 1) for u in sorted(graph.neighbors(v))
            ],
        )
    if config.active_adversary:
        task.cohort.extend(participants_for(ids, ids.device_ids()))
    return task


@dataclass(frozen=True)
class RoundTaskView:
    """A checked RoundTask, in the values a device needs."""

    session_id: bytes
    round_number: int
    model_name: str
    model_version: int
    config: SecAggConfig
    ids: RoundIds  # the client's devices, their neighbours (and the cohort in active mode)
    devices: dict[int, int]  # hosted device_id -> 0-based secagg id
    hyperparameters: dict[str, Any]
    dp: session_pb2.DpSettings
    deadlines: dict[str, float]
    global_parameters: dict[str, np.ndarray] = field(repr=False)
    metrics: MetricLayout = EMPTY_LAYOUT  # the metric coordinates after the update
    #: The discrete Gaussian's configuration (D88); None: no DP, or the float Gaussian.
    mechanism: MechanismConfig | None = None
    #: Removable noise's components (D110); None: D19's shares.
    removable: RemovableNoise | None = None

    @property
    def update_length(self) -> int:
        """Coordinates of the model update: the masked vector minus the
        metrics, or with the discrete Gaussian its length before padding."""
        if self.mechanism is not None:
            return self.mechanism.dim
        return self.config.vector_length - self.metrics.coordinates

    @property
    def rotation_seed(self) -> bytes:
        """The discrete Gaussian's shared rotation seed (`wire.dp_task.rotation_seed`)."""
        return rotation_seed(self.session_id, bytes(self.dp.rotation_key))


def parse_round_task(
    task: session_pb2.RoundTask,
    *,
    hosted: Iterable[int] | None = None,
    expected_parameters: Mapping[str, tuple[int, ...]] | None = None,
    writable_parameters: bool = False,
) -> RoundTaskView:
    """Device side: check and unpack a RoundTask. `hosted`: the device ids
    this client hosts (every assignment must be one of them)."""
    if not 1 <= len(task.model_name) <= MAX_MODEL_NAME_CHARS:
        raise WireError("RoundTask.model_name is empty or too long")
    if not task.HasField("secagg"):
        raise WireError("RoundTask has no secagg settings")
    config = secagg_config_from_proto(task.secagg, task.session_id)
    n = config.num_clients
    if not task.assignments:
        raise WireError("RoundTask assigns no device")
    everyone = [a.self for a in task.assignments]
    for a in task.assignments:
        everyone.extend(a.neighbours)
    everyone.extend(task.cohort)
    ids = RoundIds.from_participants(everyone, num_clients=n, components=config.removable_components)
    if config.active_adversary and len(task.cohort) != n:
        raise WireError(f"RoundTask.cohort lists {len(task.cohort)} devices; active mode needs all {n}")
    graph = config.graph(task.round_number)
    hosted_set = None if hosted is None else set(hosted)
    devices: dict[int, int] = {}
    for a in task.assignments:
        d = a.self.device_id
        if d in devices:
            raise WireError(f"RoundTask assigns device {d} twice")
        if hosted_set is not None and d not in hosted_set:
            raise WireError(f"RoundTask assigns device {d}, which this client does not host")
        v = ids.secagg(d)
        got = {ids.secagg(p.device_id) for p in a.neighbours}
        if len(got) != len(a.neighbours) or got != graph.neighbors(v):
            raise WireError(f"RoundTask: the neighbours of device {d} are not its neighbours in the round's graph")
        devices[d] = v
    if len(task.hyperparameters_json) > MAX_HYPERPARAMETERS_CHARS:
        raise WireError("RoundTask.hyperparameters_json is too long")
    try:
        hyper = json.loads(task.hyperparameters_json) if task.hyperparameters_json else {}
    except ValueError as exc:
        raise WireError(f"RoundTask.hyperparameters_json is not JSON: {exc}") from None
    if not isinstance(hyper, dict):
        raise WireError("RoundTask.hyperparameters_json is not a JSON object")
    dp = task.dp
    if dp.mode not in (session_pb2.DP_MODE_NONE, session_pb2.DP_MODE_LOCAL, session_pb2.DP_MODE_DISTRIBUTED):
        raise WireError(f"RoundTask.dp.mode {dp.mode} is unspecified or unknown")
    if dp.mode != session_pb2.DP_MODE_NONE and not (
        math.isfinite(dp.clip_norm) and dp.clip_norm > 0 and math.isfinite(dp.noise_stddev) and dp.noise_stddev >= 0
    ):
        raise WireError("RoundTask.dp: clip_norm must be > 0 and noise_stddev >= 0")
    metrics = MetricLayout.for_round(list(task.metric_names), config.encoding)
    if metrics.coordinates >= config.vector_length:
        raise WireError(f"RoundTask: {metrics.coordinates} metric coordinates leave no room for the update in "
                        f"vector_length {config.vector_length}")
    mechanism = task_mechanism(dp, config, metrics.coordinates,
                               encoding_devices=task.secagg.encoding_cohort_size or config.num_clients)
    removable = task_removable(dp, config, mechanism)
    return RoundTaskView(
        session_id=bytes(task.session_id),
        round_number=int(task.round_number),
        model_name=task.model_name,
        model_version=int(task.model_version),
        config=config,
        ids=ids,
        devices=devices,
        hyperparameters=hyper,
        dp=dp,
        deadlines=deadlines_from_proto(task.deadlines),
        global_parameters=params_from_proto(
            task.global_parameters, expected=expected_parameters, writable=writable_parameters
        ),
        metrics=metrics,
        mechanism=mechanism,
        removable=removable,
    )
