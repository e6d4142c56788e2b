"""The RoundTask's DP settings <-> the discrete Gaussian mechanism both sides derive (D88).

Coordinator: `discrete_gaussian_settings(mode, noise_multiplier, mechanism)`
is the DpSettings of a round whose devices add the distributed discrete
Gaussian (`dpmech.calibrate` chose the mechanism). Device:
`task_mechanism(dp, config, metric_coordinates)` rebuilds the IDENTICAL
`dpmech.mechanism.MechanismConfig`, or None for a round without it (DP off,
or the float Gaussian), and refuses with WireError what cannot be right:

- every parameter checked for meaning: sigma^2 an exact positive fraction,
  scale and clip positive and finite, the update at least one coordinate;
- the field is the secure sum's (2^modulus_bits) and sized for the cohort
  (`num_clients`): `MechanismConfig` refuses a field in which the true sum
  may wrap with probability above 1e-9, a sigma^2 the exact sampler cannot
  draw, or sigma < 1/2;
- the masked vector is exactly the padded update, d' coordinates: the round
  carries no metric coordinates, whose totals would leave the device
  without noise (D36);
- the bound B a device rounds under is computed by the device itself from
  (clip * scale, d'), never read from the task.

The rotation's seed (`rotation_seed`) is the round's session id under a
label (in a round in groups, D99, the round's `rotation_key`, the same in
every group's task, under another label): the session id commits to the whole task (`wire.round_binding`), and
every device of one secure-aggregation instance must hold the same session
id or the masks do not cancel, so a coordinator cannot give one device a
rotation of its own without that device's input falling out of the sum.
"""

from __future__ import annotations

import math
from fractions import Fraction

from dpmech.mechanism import MechanismConfig
from dpmech.removable_encoding import RemovableNoise
from fedmask_proto.v1 import session_pb2
from secagg.config import SecAggConfig
from wire.errors import WireError

DISCRETE_GAUSSIAN = "discrete-gaussian"
GAUSSIAN_FLOAT = "gaussian-float"
#: The mechanisms a round can name, the default first.
MECHANISMS: tuple[str, ...] = (DISCRETE_GAUSSIAN, GAUSSIAN_FLOAT)
_NAMES = {
    session_pb2.DP_MECHANISM_UNSPECIFIED: GAUSSIAN_FLOAT,  # before fedmask.v1.2: the only mechanism
    session_pb2.DP_MECHANISM_GAUSSIAN_FLOAT: GAUSSIAN_FLOAT,
    session_pb2.DP_MECHANISM_DISCRETE_GAUSSIAN: DISCRETE_GAUSSIAN,
}
ROTATION_LABEL = b"fedmask/dp-rotation-seed/v1\x00"
_MAX_UPDATE_LENGTH = 1 << 31


#: The lengths a DpSettings.rotation_key may have (fedmask.v1.3, D99).
ROTATION_KEY_BYTES = (16, 64)
ROTATION_KEY_LABEL = b"fedmask/dp-rotation-key/v1\x00"


def rotation_seed(session_id: bytes, rotation_key: bytes = b"") -> bytes:
    """The shared seed of a round's randomised Hadamard rotation: its
    session id, labelled; or, in a round in groups, the round's rotation key
    (DpSettings.rotation_key, D99), under its own label."""
    if rotation_key:
        return ROTATION_KEY_LABEL + bytes(rotation_key)
    return ROTATION_LABEL + bytes(session_id)


def mechanism_name(dp: session_pb2.DpSettings) -> str:
    """"none" (DP off), "gaussian-float" or "discrete-gaussian"; WireError for an unknown value."""
    if dp.mode == session_pb2.DP_MODE_NONE:
        return "none"
    name = _NAMES.get(dp.mechanism)
    if name is None:
        raise WireError(f"RoundTask.dp.mechanism {dp.mechanism} is unknown")
    return name


def discrete_gaussian_settings(*, mode: session_pb2.DpMode.ValueType, noise_multiplier: float,
                               mechanism: MechanismConfig, rotation_key: bytes = b"") -> session_pb2.DpSettings:
    """The DpSettings of a round with `mechanism` (mode local or distributed);
    `rotation_key`: the round's, when it runs in groups (D99)."""
    if mode not in (session_pb2.DP_MODE_LOCAL, session_pb2.DP_MODE_DISTRIBUTED):
        raise ValueError("the discrete Gaussian runs with mode local or distributed")
    return session_pb2.DpSettings(
        mode=mode, clip_norm=mechanism.clip, noise_multiplier=noise_multiplier,
        mechanism=session_pb2.DP_MECHANISM_DISCRETE_GAUSSIAN,
        noise_variance_numerator=mechanism.sigma2.numerator, noise_variance_denominator=mechanism.sigma2.denominator,
        scale=mechanism.scale, update_length=mechanism.dim, rotation_key=rotation_key,
    )


def task_mechanism(dp: session_pb2.DpSettings, config: SecAggConfig, metric_coordinates: int, *,
                   encoding_devices: int | None = None) -> MechanismConfig | None:
    """Device side: the round's mechanism (see the module doc), None without
    one. `encoding_devices`: the devices the round's field is sized for (the
    whole cohort when this instance is one group of a round in groups, D99;
    default: the instance's); the field is checked for that many."""
    if mechanism_name(dp) != DISCRETE_GAUSSIAN:
        if dp.rotation_key:
            raise WireError("RoundTask.dp: a rotation key without the discrete Gaussian")
        return None
    lo, hi = ROTATION_KEY_BYTES
    if dp.rotation_key and not lo <= len(dp.rotation_key) <= hi:
        raise WireError(f"RoundTask.dp: a rotation key is {lo} to {hi} bytes, got {len(dp.rotation_key)}")
    num, den = int(dp.noise_variance_numerator), int(dp.noise_variance_denominator)
    if num < 1 or den < 1:
        raise WireError("RoundTask.dp: the discrete Gaussian's noise variance must be a positive fraction")
    if not (math.isfinite(dp.scale) and dp.scale > 0 and math.isfinite(dp.clip_norm) and dp.clip_norm > 0):
        raise WireError("RoundTask.dp: the discrete Gaussian's scale and clip must be positive numbers")
    if not (math.isfinite(dp.noise_multiplier) and dp.noise_multiplier > 0):
        raise WireError("RoundTask.dp: the discrete Gaussian's noise multiplier must be > 0")
    if not 1 <= dp.update_length <= _MAX_UPDATE_LENGTH:
        raise WireError(f"RoundTask.dp: update_length {dp.update_length} is out of range")
    if metric_coordinates:
        raise WireError("RoundTask: a discrete-Gaussian round carries no metric coordinates (their totals would "
                        "leave the devices without noise, D36)")
    try:
        mechanism = MechanismConfig(dim=int(dp.update_length), clip=float(dp.clip_norm), scale=float(dp.scale),
                                    sigma2=Fraction(num, den), bits=config.encoding.modulus_bits,
                                    devices=max(config.num_clients, encoding_devices or 0))
    except (ValueError, TypeError) as exc:
        raise WireError(f"RoundTask.dp: {exc}") from None
    if mechanism.padded_dim != config.vector_length:
        raise WireError(f"RoundTask: an update of {mechanism.dim} coordinates is masked as {mechanism.padded_dim}, "
                        f"but secagg.vector_length is {config.vector_length}")
    return mechanism


def task_removable(dp: session_pb2.DpSettings, config: SecAggConfig,
                   mechanism: MechanismConfig | None) -> RemovableNoise | None:
    """Device side: the round's removable noise (SecaggSettings.removable_noise,
    D110), None without it. Refused (WireError) unless the round runs the
    distributed discrete Gaussian (the removal is exact only in its integer
    field, and only distributed shares are sized to the group; the complete
    graph is `SecAggConfig`'s own check)."""
    if not config.removable_noise:
        return None
    if mechanism is None or dp.mode != session_pb2.DP_MODE_DISTRIBUTED:
        raise WireError("RoundTask: removable noise needs dp.mode distributed with the discrete Gaussian")
    try:
        return RemovableNoise.for_group(mechanism, config.num_clients, config.threshold)
    except ValueError as exc:
        raise WireError(f"RoundTask: removable noise: {exc}") from None


__all__ = ["DISCRETE_GAUSSIAN", "GAUSSIAN_FLOAT", "MECHANISMS", "ROTATION_KEY_BYTES", "ROTATION_LABEL",
           "discrete_gaussian_settings",
           "mechanism_name", "rotation_seed", "task_mechanism", "task_removable"]
