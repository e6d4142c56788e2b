"""A completed secure sum, split and decoded: `AggregateResult` and
`aggregate_result` (every round path: the secure machine, the plaintext and
hybrid paths, rounds in groups, removable noise)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpmech.mechanism import MechanismConfig, decode_sum
from secagg.config import SecAggConfig
from wire.dp_task import rotation_seed
from wire.round_metrics import MetricLayout


@dataclass(frozen=True, slots=True, eq=False)
class AggregateResult:
    """What the secagg server produced: the exact encoded sum and its decoding."""

    counted: tuple[int, ...]  # device ids whose inputs are in the sum (U3)
    encoded_sum: np.ndarray  # uint32 (L + M,): the whole unmasked sum mod 2^w, metric limbs included
    decoded_sum: np.ndarray  # float64 (L,): the model update's coordinates only
    decoded_mean: np.ndarray  # float64 (L,)
    metric_sums: np.ndarray  # uint32 (M,): the metric limbs' sums, undecoded
    #: removable noise (D110): the unmasked sum before the surplus was removed (uint32, mod 2^w);
    #: None when nothing was removed (then it is `encoded_sum`)
    unmasked_sum: np.ndarray | None = None


def aggregate_result(config: SecAggConfig, metrics: MetricLayout, encoded_sum: np.ndarray,
                     counted: tuple[int, ...], mechanism: MechanismConfig | None = None,
                     rotation_key: bytes = b"") -> AggregateResult:
    """Split an exact encoded sum of `counted` devices into the model update
    (its first L = vector_length - metrics.coordinates coordinates, decoded
    with the round's fixed-point encoding, or with the discrete Gaussian
    `mechanism` and the round's rotation seed (from the session id, or the
    `rotation_key` of a round in groups, D99): the centred residue of the
    sum, rotated back and unscaled, `dpmech.mechanism.decode_sum`) and the
    metric limbs (the rest).
    The two parts are separate coordinates of a coordinatewise sum, so
    nothing in the metric limbs changes the model update.

    The whole sum is first reduced mod 2^w (`FixedPointEncoding.reduce`), the
    ring both the fixed-point encoding and the metric limbs are defined in:
    the secagg server unmasks mod 2^32, and a hostile device's out-of-range
    input would otherwise reach 2^(32 - w) times further (D86). An honest
    sum is below 2^w and passes unchanged, so `encoded_sum` stays the exact
    sum of the counted devices' encoded inputs."""
    encoded_sum = config.encoding.reduce(encoded_sum)
    length = config.vector_length - metrics.coordinates
    model = encoded_sum[:length]
    if mechanism is None:
        decoded = config.encoding.decode_sum(model, len(counted))
    else:
        decoded = decode_sum(model, mechanism, rotation_seed(config.session_id, rotation_key))
    return AggregateResult(
        counted=counted,
        encoded_sum=encoded_sum,
        decoded_sum=decoded,
        decoded_mean=decoded / len(counted),
        metric_sums=np.array(encoded_sum[length:], dtype=np.uint32),
    )
