"""A round's mechanism from what an operator sets: the scale and each share's noise.

The operator states the clip c, the noise multiplier z (the released sum's
noise std over its L2 sensitivity), the field 2^w and the cohort; the
mechanism also needs a scale s and each device's sigma^2. `calibrate`
chooses them:

- `shares`: how many devices' noise one released sum carries when nobody
  drops out: its group's size with distributed noise, 1 with local noise
  (each device adds all of it);
- sigma^2 = z^2 Delta_2^2 / shares, rounded up to an exact fraction
  (`mechanism.local_sigma2`), where Delta_2 = sqrt(B) is the sensitivity
  after rotation and rounding (B from s c, `quantize.norm_bound_sq`), so
  z is what the sum carries in units of the sensitivity it really has;
- s: the largest with s c = 2^k, k from `MAX_SCALED_CLIP_LOG2` down to
  `MIN_SCALED_CLIP_LOG2`, for which the configuration is valid: the exact
  sampler can draw sigma^2 and the field holds the cohort's sum
  (`MechanismConfig` refuses otherwise). A larger s c shrinks rounding's
  part of the sensitivity, B ~ (s c)^2 + d'/4 + ...: at s c = 2^12 and
  d' = 65,536, B is 1.001 (s c)^2; beyond 2^16 nothing measurable is left
  to gain.

`with_shares` gives the same mechanism (same scale, field and
sensitivity) for a sum of another number of shares: the groups of one
round share the scale and the field (one encoding per round, D87) but each
calibrates its shares to its own size. Calibrate with the smallest group,
whose shares are the largest, so the field is checked for the most noise.
"""

from __future__ import annotations

import dataclasses
import math

from dpmech.accounting import sensitivities
from dpmech.mechanism import DEFAULT_OVERFLOW_TARGET, MechanismConfig, local_sigma2
from dpmech.quantize import norm_bound_sq
from dpmech.rotation import padded_dimension

MAX_SCALED_CLIP_LOG2 = 16
MIN_SCALED_CLIP_LOG2 = 2


def calibrate(*, dim: int, clip: float, noise_multiplier: float, devices: int, shares: int, bits: int,
              overflow_target: float = DEFAULT_OVERFLOW_TARGET) -> MechanismConfig:
    """The mechanism for updates of `dim` coordinates clipped to `clip`,
    whose released sums carry noise `noise_multiplier` times their
    sensitivity from `shares` devices' shares, in a field of 2^`bits` sized
    for sums of up to `devices` inputs (the cohort). ValueError, naming what
    to change, when no scale fits."""
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(f"the discrete Gaussian needs a noise multiplier > 0, got {noise_multiplier}")
    if not (isinstance(shares, int) and 1 <= shares <= devices):
        raise ValueError(f"shares must be an int in 1..{devices} (the devices whose noise a sum carries), got {shares!r}")
    if not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"clip must be a positive finite number, got {clip!r}")
    padded = padded_dimension(dim)
    last = ""
    for k in range(MAX_SCALED_CLIP_LOG2, MIN_SCALED_CLIP_LOG2 - 1, -1):
        scaled_clip = float(1 << k)
        sensitivity = sensitivities(norm_bound_sq(scaled_clip, padded), padded)[0]
        try:
            return MechanismConfig(dim=dim, clip=clip, scale=scaled_clip / clip, bits=bits, devices=devices,
                                   sigma2=local_sigma2(noise_multiplier, sensitivity, shares),
                                   overflow_target=overflow_target)
        except ValueError as exc:
            last = str(exc)
    raise ValueError(
        f"no scale fits the discrete Gaussian for {devices} devices, noise multiplier {noise_multiplier:g} "
        f"({shares} share(s) per sum) and {dim} coordinates in a field of 2^{bits}, down to a scaled clip of "
        f"2^{MIN_SCALED_CLIP_LOG2}: {last}")


def with_shares(config: MechanismConfig, noise_multiplier: float, shares: int) -> MechanismConfig:
    """`config` with each device's sigma^2 recalibrated for sums of `shares`
    devices' shares (scale, field and sensitivity unchanged)."""
    if not (isinstance(shares, int) and 1 <= shares <= config.devices):
        raise ValueError(f"shares must be an int in 1..{config.devices}, got {shares!r}")
    return dataclasses.replace(config, sigma2=local_sigma2(noise_multiplier, config.sensitivity, shares))


def noise_multiplier_of(rho: float) -> float:
    """The Gaussian noise multiplier with the same Renyi curve as rho-zCDP:
    rho = 1 / (2 z^2), so z = 1 / sqrt(2 rho) (math.inf for rho = 0, 0 for
    rho = inf). A round priced at rho and one of the Gaussian mechanism at
    this z compose identically under an RDP accountant."""
    if math.isnan(rho) or rho < 0:
        raise ValueError(f"rho must be >= 0, got {rho}")
    if rho == 0:
        return math.inf
    return 0.0 if math.isinf(rho) else 1.0 / math.sqrt(2.0 * rho)


__all__ = ["MAX_SCALED_CLIP_LOG2", "MIN_SCALED_CLIP_LOG2", "calibrate", "noise_multiplier_of", "with_shares"]
