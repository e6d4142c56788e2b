"""The distributed discrete Gaussian mechanism, end to end, as pure functions.

On a device (`encode`), for an update x of length d:

1. clip x to L2 norm c;                                  (`quantize.clip_l2`)
2. rotate: R x = H D x / sqrt(d'), zero-padded to d' = 2^ceil(log2 d),
   signs D from the round's shared seed;                  (`rotation.rotate`)
3. scale by s (integer units per model unit);
4. round each coordinate randomly, again until the squared norm is <= B
   (`quantize.norm_bound_sq`; B is the one-device L2 sensitivity squared);
5. add N_Z(0, sigma^2) to every coordinate, sampled exactly from the
   operating system's CSPRNG;                             (`exact_sampler`)

and reduce mod 2^w to the centred range [-2^(w-1), 2^(w-1)) (`field.wrap`):
the noise is never clipped. Secure aggregation adds the devices' vectors
mod 2^w (`field.to_unsigned` gives the residues it masks).

On the server (`decode_sum`): take the sum's centred representative mod
2^w, undo the rotation (exactly, in integers, then one division by
sqrt(d')) and the scaling: an estimate of the sum of the clipped updates
plus the noise of the counted devices' shares, correct whenever the true
sum did not wrap (probability >= 1 - `MechanismConfig.overflow_probability`).

`privacy_rho` is the round's zCDP for the devices it counted
(`accounting`). `MechanismConfig` refuses what cannot work: a field too small
for the cohort and its noise, a noise variance outside the exact sampler's
range or below the bound's sigma >= 1/2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from dpmech import accounting, exact_sampler, fast_sampler  # accounting: no dp_accounting at import
from dpmech import field as modular
from dpmech.quantize import DEFAULT_BETA, clip_l2, norm_bound_sq, round_within_bound
from dpmech.random_source import I64, ByteSource, SystemBytes
from dpmech.rotation import padded_dimension, rotate, unrotate

F64 = npt.NDArray[np.float64]
DEFAULT_OVERFLOW_TARGET = 1e-9
MIN_SIGMA2 = Fraction(1, 4)  # the accountant's bound holds for sigma >= 1/2


@dataclass(frozen=True)
class MechanismConfig:
    """One round's mechanism, the same on every device and the server.

    `sigma2` is each device's noise variance in integer units (exact);
    `devices` the most inputs a sum may add (the cohort), which sizes the
    field; `overflow_target` the largest accepted bound on the chance that a
    true sum wraps."""

    dim: int
    clip: float
    scale: float
    sigma2: Fraction
    bits: int
    devices: int
    beta: float = DEFAULT_BETA
    overflow_target: float = DEFAULT_OVERFLOW_TARGET
    padded_dim: int = field(init=False)
    bound_sq: int = field(init=False)
    overflow_probability: float = field(init=False)

    def __post_init__(self) -> None:
        if not (isinstance(self.dim, int) and self.dim >= 1):
            raise ValueError(f"dim must be a positive int, got {self.dim!r}")
        for name, value in (("clip", self.clip), ("scale", self.scale)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        if not (isinstance(self.devices, int) and self.devices >= 1):
            raise ValueError(f"devices must be a positive int, got {self.devices!r}")
        if not isinstance(self.sigma2, Fraction) or self.sigma2 < MIN_SIGMA2:
            raise ValueError(f"sigma2 must be a Fraction >= 1/4 (sigma >= 1/2), got {self.sigma2!r}")
        exact_sampler.check_variance(self.sigma2)
        scaled_clip = self.scale * self.clip
        if scaled_clip + 1 >= 2.0 ** 40:
            raise ValueError(f"scale * clip = {scaled_clip:.3g} leaves the int64 headroom; use a smaller scale")
        padded = padded_dimension(self.dim)
        object.__setattr__(self, "padded_dim", padded)
        object.__setattr__(self, "bound_sq", norm_bound_sq(scaled_clip, padded, self.beta))
        bound = modular.check_field(self.devices, scaled_clip, padded, float(self.sigma2), self.bits,
                                    self.overflow_target)
        object.__setattr__(self, "overflow_probability", bound)

    @property
    def sensitivity(self) -> float:
        """Delta_2 = sqrt(B): how far one device's rounded vector can move the sum."""
        return accounting.sensitivities(self.bound_sq, self.padded_dim)[0]


def local_sigma2(noise_multiplier: float, sensitivity: float, devices: int) -> Fraction:
    """Each device's sigma^2 so that `devices` shares sum to noise std
    >= noise_multiplier * sensitivity, rounded UP to an exact Fraction
    (a whole number above 1024, else a multiple of 1/64)."""
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0 and sensitivity > 0 and devices >= 1):
        raise ValueError("need noise_multiplier > 0, sensitivity > 0 and devices >= 1")
    target = (noise_multiplier * sensitivity) ** 2 / devices
    exact = Fraction(math.ceil(target)) if target >= 1024 else Fraction(math.ceil(target * 64), 64)
    while float(exact) * devices < (noise_multiplier * sensitivity) ** 2:  # float rounding, never down
        exact += Fraction(1, 64)
    return max(exact, MIN_SIGMA2)


def quantize(update: F64, config: MechanismConfig, rotation_seed: bytes, rng: np.random.Generator) -> I64:
    """Steps 1-4 for each row of `update` (..., dim): the rounded integer
    vectors (..., d'), each with squared norm <= config.bound_sq."""
    if update.shape[-1] != config.dim:
        raise ValueError(f"an update has {update.shape[-1]} coordinates, the mechanism expects {config.dim}")
    z = rotate(clip_l2(np.asarray(update, dtype=np.float64), config.clip), rotation_seed)
    z *= config.scale
    return round_within_bound(z, config.bound_sq, rng, max_tries=10_000)


def encode(update: F64, config: MechanismConfig, rotation_seed: bytes, rng: np.random.Generator,
           noise: ByteSource | None = None) -> I64:
    """A device's vector for the secure sum: steps 1-5, centred mod 2^w.
    The noise comes from `noise` (default: the operating system's CSPRNG)."""
    if update.ndim != 1:
        raise ValueError(f"encode takes one update (dim,), got shape {update.shape}")
    rounded = quantize(update, config, rotation_seed, rng)
    shares = exact_sampler.discrete_gaussian(config.padded_dim, config.sigma2, noise or SystemBytes())
    return modular.wrap(rounded + shares, config.bits)


def simulated_sum(rounded: I64, config: MechanismConfig, rng: np.random.Generator) -> I64:
    """The simulator's secure sum of rows `rounded` (m, d'): their sum plus
    m noise shares drawn from the seeded sampler (same law as a device's),
    centred mod 2^w. Not for a device: the noise is predictable from rng."""
    if rounded.ndim != 2 or rounded.shape[1] != config.padded_dim:
        raise ValueError(f"expected rows of length {config.padded_dim}, got shape {rounded.shape}")
    noise = fast_sampler.sum_of_discrete_gaussians(rng, rounded.shape[0], config.padded_dim, config.sigma2)
    return modular.wrap(rounded.sum(axis=0) + noise, config.bits)


def decode_sum(total: npt.NDArray[np.signedinteger] | npt.NDArray[np.unsignedinteger], config: MechanismConfig,
               rotation_seed: bytes) -> F64:
    """The server's estimate of the sum of the counted devices' clipped
    updates (model units, length dim), from their sum mod 2^w in any
    representative (centred ints or residues)."""
    if total.shape != (config.padded_dim,):
        raise ValueError(f"the sum must have {config.padded_dim} coordinates, got shape {total.shape}")
    if np.issubdtype(total.dtype, np.unsignedinteger):
        centred = modular.from_unsigned(total.astype(np.uint64), config.bits)
    else:
        centred = modular.wrap(total.astype(np.int64), config.bits)
    return unrotate(centred, rotation_seed, config.dim) / config.scale


def privacy_rho(config: MechanismConfig, counted: int, *, replace_one: bool = False) -> float:
    """zCDP rho of one release of the sum of `counted` devices' vectors
    (their noise shares are what the sum carries: dropouts lower it)."""
    l2, l1 = accounting.sensitivities(config.bound_sq, config.padded_dim, replace_one=replace_one)
    return accounting.zcdp_rho(l2=l2, l1=l1, devices=counted, sigma2=config.sigma2, padded_dim=config.padded_dim)
