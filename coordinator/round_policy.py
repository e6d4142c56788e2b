"""Round policy: what a round about to open is configured with. Pure: no
I/O, no clock, no randomness (the session id is passed in).

    secagg_config_for(settings, n, L, session_id)  the SecAggConfig of a cohort
    metric_names_for(model_metrics, dp, ...)       the metrics a round asks for
    dp_mechanism_for(settings, n, L)               the discrete Gaussian of a
                                                   cohort of n (D88), or None
    round_vector_for(settings, n, L, sid, names)   the config of an update of L
                                                   plus the metric coordinates
    round_plan(settings, n, L, sid, metrics, ...)  all three for a round
    dp_settings_for(dp, n, mechanism)              the RoundTask's DpSettings
    dp_refusal(settings, L)                        why the DP settings cannot
                                                   run (checked at start)
    round_windows(deadlines, ...)                  per-stage seconds for the
                                                   round machine and the RoundTask
    AdaptiveDeadlines                              each stage's deadline, learnt
                                                   from what honest devices took

Adaptive deadlines (D21, `deadlines.policy = "adaptive"`, the default)
-----------------------------------------------------------------------
A stage that waits for a silent (dropped) device lasts its whole deadline,
so a deadline far above what honest devices need makes every round with a
dropout slow, and one barely above it drops honest devices whenever the
machine is busy. For every stage the policy keeps the *honest completion
time* of recent rounds: the seconds from the stage opening to the last
answer the round accepted in it (a device that answered is, for this
purpose, honest; a silent one contributes nothing). The next round's
deadline is

    clamp(margin * q-quantile(last `window` completion times) + slack,
          floor, ceiling)

where the ceiling is the stage's configured deadline (also the deadline
before the first observation: a safe start), and the floor keeps a stage
from collapsing on an idle fleet. Consequences, stated as the contract:

- A deadline only tightens below the configured one when honest devices
  were seen to answer well within it; an honest device that needs more than
  margin x the recent slowest plus slack is dropped, and the next deadline
  grows from what was seen (a deadline that was hit raises its own
  completion time towards the deadline, so the policy recovers upward).
- A slow device (or a device that answers late on purpose) can push a
  stage's deadline up, never beyond its ceiling: the cost of a malicious
  device is bounded by the configured deadlines, as without the policy.
- The learnt state is in memory: a restarted coordinator starts again from
  the ceilings.

`deadlines.policy = "fixed"` uses the configured deadlines as they are.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from coordinator.settings import CoordinatorSettings, DeadlineSettings, DpSettings
from dpmech.calibrate import calibrate
from dpmech.mechanism import MechanismConfig
from dpmech.rotation import padded_dimension
from fedmask_proto.v1 import session_pb2
from secagg.config import SecAggConfig
from secagg.errors import SecAggConfigError
from secagg.groups import group_session_id
from secagg.stages import Stage
from wire.dp_task import DISCRETE_GAUSSIAN, discrete_gaussian_settings
from wire.protocol import HYBRID_J_BOUND_HYPERPARAMETER, PLAINTEXT_HYPERPARAMETER, ROUND_INDEX_HYPERPARAMETER
from wire.round_metrics import MetricLayout

# --------------------------------------------------------------------------- secure aggregation


def secagg_config_for(settings: CoordinatorSettings, n: int, vector_length: int, session_id: bytes) -> SecAggConfig:
    """Resolve the secagg policy of the settings for a cohort of n devices.
    graph: "full" -> complete graph; "auto" -> SecAgg+ (secagg picks k and t),
    or the complete graph when secagg finds no sparse (k, t) for so small a
    cohort; K -> Harary graph of degree K (complete if K >= n - 1).
    threshold: the policy applied to the group (k + 1 devices), raised to the
    strict majority secagg requires (2n/3 + 1 on a complete graph in active
    mode); with a sparse "auto" graph, secagg's own t is used.
    Raises secagg's SecAggConfigError when no configuration fits n."""
    s = settings.secagg
    active = s.signatures
    neighbors: int | Literal["all", "auto"]
    if s.graph == "full":
        neighbors = "all"
    elif s.graph == "auto":
        try:
            auto = SecAggConfig.create(
                num_clients=n, vector_length=vector_length, session_id=session_id, clip=s.clip, neighbors="auto",
                modulus_bits=s.modulus_bits, expected_dropout=s.expected_dropout, active_adversary=active,
            )
            if not auto.is_complete_graph:
                return auto
        except SecAggConfigError:
            pass
        neighbors = "all"  # too small for a sparse graph: Bonawitz with the threshold policy
    else:
        neighbors = int(s.graph)
    k = n - 1 if neighbors == "all" else min(int(neighbors), n - 1)  # K >= n - 1: complete graph
    group = k + 1
    threshold = max(s.threshold_for(group), group // 2 + 1)
    if active and k == n - 1:
        threshold = max(threshold, (2 * n) // 3 + 1)
    return SecAggConfig.create(
        num_clients=n,
        vector_length=vector_length,
        session_id=session_id,
        clip=s.clip,
        neighbors=neighbors,
        threshold=threshold,
        modulus_bits=s.modulus_bits,
        expected_dropout=s.expected_dropout,
        active_adversary=active,
        removable_noise=settings.dp.dropouts == "remove",
    )


def group_configs_for(settings: CoordinatorSettings, whole: SecAggConfig,
                      groups: Sequence[Sequence[int]]) -> tuple[SecAggConfig, ...]:
    """One config per group of a round in groups (D87, D99): the settings'
    graph and threshold policy for the group's size (`secagg_config_for`),
    the group's own session id nonce (`group_session_id` of the round's),
    and the ONE encoding of the round, `whole`'s (sized for the cohort),
    with `whole`'s vector (the update and the metric coordinates).
    SecAggConfigError when no configuration fits a group."""
    out = []
    for j, g in enumerate(groups):
        config = secagg_config_for(settings, len(g), whole.vector_length, group_session_id(whole.session_id, j))
        out.append(dataclasses.replace(config, encoding=whole.encoding.for_group(len(g))))
    return tuple(out)


def metric_names_for(model_metrics: Sequence[str], dp: DpSettings, *, plaintext: bool,
                     enabled: bool = True) -> tuple[str, ...]:
    """The metrics a round asks every device to append to its masked input
    (D35): the model's, plus `clipped` (1 per clipped device) when devices
    clip for DP. None when the operator turned metrics off (`round_metrics`),
    in an INSECURE plaintext round (there each device's input arrives in
    the clear, and so would its metrics), and under DP with the discrete
    Gaussian: the totals would be released without noise, outside the
    epsilon the ledger reports (D36, D88)."""
    if plaintext or not enabled or uses_discrete_gaussian(dp):
        return ()
    names = tuple(model_metrics)
    if dp.mode != "none" and dp.clip > 0 and "clipped" not in names:
        names += ("clipped",)
    return names


def round_vector_for(
    settings: CoordinatorSettings, n: int, update_dim: int, session_id: bytes, metric_names: Sequence[str],
    mechanism: MechanismConfig | None = None,
) -> tuple[SecAggConfig, MetricLayout]:
    """`secagg_config_for` a vector of the model update (update_dim; with the
    discrete Gaussian `mechanism`, its d' residues) followed by the metric
    coordinates; their limb width comes from the cohort's encoding
    (wire.round_metrics), which does not depend on the length.
    Raises SecAggConfigError when no configuration fits n."""
    length = update_dim if mechanism is None else mechanism.padded_dim
    config = secagg_config_for(settings, n, length, session_id)
    metrics = MetricLayout.for_round(metric_names, config.encoding)
    if metrics.coordinates:
        config = dataclasses.replace(config, vector_length=length + metrics.coordinates)
    return config, metrics


def round_plan(settings: CoordinatorSettings, n: int, update_dim: int, session_id: bytes,
               model_metrics: Sequence[str], *, plaintext: bool
               ) -> tuple[SecAggConfig, MetricLayout, MechanismConfig | None]:
    """A round of n devices: its config and metric layout (`round_vector_for`
    of the metrics `metric_names_for` asks for) and its discrete Gaussian
    (`dp_mechanism_for`, None without it). SecAggConfigError or ValueError
    when nothing fits n."""
    mechanism = dp_mechanism_for(settings, n, update_dim)
    names = metric_names_for(model_metrics, settings.dp, plaintext=plaintext, enabled=settings.round_metrics)
    config, metrics = round_vector_for(settings, n, update_dim, session_id, names, mechanism)
    return config, metrics, mechanism


# --------------------------------------------------------------------------- differential privacy


def uses_discrete_gaussian(dp: DpSettings) -> bool:
    """DP is on and its mechanism is the distributed discrete Gaussian (D88)."""
    return dp.mode != "none" and dp.mechanism == DISCRETE_GAUSSIAN


def dp_mechanism_for(settings: CoordinatorSettings, n: int, update_dim: int,
                     shares: int | None = None) -> MechanismConfig | None:
    """The discrete Gaussian of a round of n devices (None without it):
    the field 2^secagg.modulus_bits sized for the n devices, each share
    calibrated so that a sum carries dp.noise_multiplier times its
    sensitivity after rotation and rounding, from the n devices' shares
    (distributed; `shares` of them in a group of a round in groups, D99) or
    from each device's alone (local); `dpmech.calibrate`. ValueError,
    naming what to change, when nothing fits."""
    dp = settings.dp
    if not uses_discrete_gaussian(dp):
        return None
    return calibrate(dim=update_dim, clip=dp.clip, noise_multiplier=dp.noise_multiplier, devices=n,
                     shares=(shares or n) if dp.mode == "distributed" else 1, bits=settings.secagg.modulus_bits)


def dp_refusal(settings: CoordinatorSettings, update_dim: int) -> str | None:
    """Why the DP settings cannot run rounds of the model's `update_dim`
    coordinates at the cohort's sizes (cohort.minimum to the selected size),
    or None. The coordinator refuses to start on it."""
    c = settings.cohort
    for n in sorted({max(c.minimum, 2), max(c.selected, 2)}):
        try:
            dp_mechanism_for(settings, n, update_dim)
        except ValueError as exc:
            return f"dp.mechanism {settings.dp.mechanism} cannot run a round of {n} devices: {exc}"
    return None


def masked_length(settings: CoordinatorSettings, update_dim: int) -> int:
    """The coordinates a device masks for the model update: update_dim, or
    with the discrete Gaussian its padded length (a power of two)."""
    return padded_dimension(update_dim) if uses_discrete_gaussian(settings.dp) else update_dim


def dp_settings_for(dp: DpSettings, cohort_size: int, mechanism: MechanismConfig | None = None, *,
                    rotation_key: bytes = b"") -> session_pb2.DpSettings:
    """The DpSettings a RoundTask carries. With the discrete Gaussian
    `mechanism` (from `dp_mechanism_for`): its share and scale (D88), and
    in a round in groups the round's `rotation_key` (D99).
    Otherwise the float Gaussian: with distributed noise each of the n
    devices adds N(0, (z * clip)^2 / n), so the sum carries z * clip."""
    if dp.mode == "none":
        return session_pb2.DpSettings(mode=session_pb2.DP_MODE_NONE)
    mode = session_pb2.DP_MODE_DISTRIBUTED if dp.mode == "distributed" else session_pb2.DP_MODE_LOCAL
    if uses_discrete_gaussian(dp):
        if mechanism is None:
            raise ValueError("a discrete-Gaussian round needs its mechanism (dp_mechanism_for)")
        return discrete_gaussian_settings(mode=mode, noise_multiplier=dp.noise_multiplier, mechanism=mechanism,
                                          rotation_key=rotation_key)
    std = dp.noise_multiplier * dp.clip
    if dp.mode == "distributed":
        std = std / math.sqrt(cohort_size)
    return session_pb2.DpSettings(mode=mode, clip_norm=dp.clip, noise_multiplier=dp.noise_multiplier, noise_stddev=std,
                                  mechanism=session_pb2.DP_MECHANISM_GAUSSIAN_FLOAT)


def task_hyperparameters(settings: CoordinatorSettings, model_hyperparameters: Mapping[str, Any],
                         step: int) -> dict[str, Any]:
    """The hyperparameters a RoundTask carries: the model's, the round index
    (the model's `step`) and wire.protocol's markers of a plaintext round and
    of the hybrid rounds' J bound (D64)."""
    hp = {**model_hyperparameters, ROUND_INDEX_HYPERPARAMETER: step}
    if settings.debug.insecure_plaintext:
        hp[PLAINTEXT_HYPERPARAMETER] = True
    if settings.hybrid.unprotected_plaintext_j_bound is not None:
        hp[HYBRID_J_BOUND_HYPERPARAMETER] = settings.hybrid.unprotected_plaintext_j_bound
    return hp


# --------------------------------------------------------------------------- deadlines


@dataclass(frozen=True, slots=True)
class RoundWindows:
    """The seconds of one round's stages.

    machine: collecting phase value -> seconds the round machine allows it
             (stage 0's window includes local training);
    task:    stage value -> seconds the RoundTask announces to the devices
             (training apart; no consistency check unless active mode)."""

    machine: dict[str, float]
    task: dict[str, float]


def round_windows(stage_seconds: Mapping[Stage, float], *, training: float, plaintext: bool,
                  active: bool) -> RoundWindows:
    """Per-stage deadlines -> the round's windows. A plaintext (INSECURE,
    benchmark) round has one stage, MASKED_INPUT, lasting training plus the
    masked-input deadline; its RoundTask announces training as the
    advertise-keys window and the masked-input deadline."""
    masked = stage_seconds[Stage.MASKED_INPUT]
    if plaintext:
        return RoundWindows(
            machine={Stage.MASKED_INPUT.value: training + masked},
            task={Stage.ADVERTISE_KEYS.value: training, Stage.MASKED_INPUT.value: masked},
        )
    machine = {s.value: stage_seconds[s] for s in Stage}
    machine[Stage.ADVERTISE_KEYS.value] += training
    task = {s.value: stage_seconds[s] for s in Stage if active or s is not Stage.CONSISTENCY_CHECK}
    task[Stage.ADVERTISE_KEYS.value] += training
    return RoundWindows(machine=machine, task=task)


def configured_deadlines(d: DeadlineSettings) -> dict[Stage, float]:
    """The configured per-stage deadlines (stage 0 without training)."""
    return {
        Stage.ADVERTISE_KEYS: d.advertise_keys,
        Stage.SHARE_KEYS: d.share_keys,
        Stage.SHARE_CHECK: d.share_check,
        Stage.MASKED_INPUT: d.masked_input,
        Stage.CONSISTENCY_CHECK: d.consistency_check,
        Stage.UNMASKING: d.unmasking,
    }


class AdaptiveDeadlines:
    """Per-stage deadlines learnt from honest completion times (module doc).

    `deadlines()` -> {Stage: seconds} for the next round, where stage 0's
    value covers training *and* advertising (its completion time is
    measured from the RoundTasks going out). `observe(completion)` takes a
    finished round's {stage value: seconds to the last accepted answer}.
    With `settings.policy == "fixed"` observations are kept but ignored.

    A plaintext (INSECURE, benchmark) coordinator runs one stage,
    MASKED_INPUT, whose window includes training: its ceiling is training +
    masked-input, and it learns like any other stage."""

    def __init__(self, settings: DeadlineSettings, *, plaintext: bool = False) -> None:
        self._settings = settings
        self._plaintext = plaintext
        ceiling = configured_deadlines(settings)
        if plaintext:
            ceiling[Stage.MASKED_INPUT] += settings.training
        else:
            ceiling[Stage.ADVERTISE_KEYS] += settings.training
        self._ceiling = ceiling
        self._seen: dict[Stage, deque[float]] = {s: deque(maxlen=settings.window) for s in Stage}

    @property
    def adaptive(self) -> bool:
        return self._settings.policy == "adaptive"

    def observe(self, completion: Mapping[str, float]) -> None:
        for name, seconds in completion.items():
            stage = _stage_or_none(name)
            if stage is not None and math.isfinite(seconds) and seconds >= 0:
                self._seen[stage].append(float(seconds))

    def deadline(self, stage: Stage, cohort: int = 0) -> float:
        """The stage's next deadline for a round of `cohort` devices: the
        learnt value within [floor, the ceiling + per_device x cohort]."""
        ceiling = self._ceiling[stage] + self._settings.per_device * max(cohort, 0)
        seen = self._seen[stage]
        if not self.adaptive or not seen:
            return ceiling
        s = self._settings
        learnt = s.margin * quantile(seen, s.quantile) + s.slack
        return min(ceiling, max(s.floor, learnt))

    def deadlines(self, cohort: int = 0) -> dict[Stage, float]:
        """{Stage: seconds}; the stage that includes training (ADVERTISE_KEYS,
        or MASKED_INPUT in a plaintext round) includes the training window."""
        return {s: self.deadline(s, cohort) for s in Stage}

    def windows(self, *, active: bool, cohort: int = 0) -> RoundWindows:
        """The next round's windows for a cohort of `cohort` devices (see
        `round_windows`), with the learnt window that includes training split
        back into training + the stage."""
        learnt = self.deadlines(cohort)
        training = self._settings.training
        first = Stage.MASKED_INPUT if self._plaintext else Stage.ADVERTISE_KEYS
        training = min(training, learnt[first])
        per_stage = {**learnt, first: learnt[first] - training}
        return round_windows(per_stage, training=training, plaintext=self._plaintext, active=active)


def quantile(values: deque[float] | list[float], q: float) -> float:
    """The q-quantile by linear interpolation (numpy's default); q in [0, 1]."""
    xs = sorted(values)
    if not xs:
        raise ValueError("quantile of no values")
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _stage_or_none(name: str) -> Stage | None:
    try:
        return Stage(name)
    except ValueError:
        return None


__all__ = [
    "AdaptiveDeadlines",
    "RoundWindows",
    "configured_deadlines",
    "dp_mechanism_for",
    "dp_refusal",
    "dp_settings_for",
    "masked_length",
    "quantile",
    "round_plan",
    "round_windows",
    "secagg_config_for",
    "uses_discrete_gaussian",
]
