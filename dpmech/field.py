"""Integers modulo 2^w with centred wraparound, and the chance that a true sum wraps.

Representation. A value of Z_{2^w} is held as the int64 in
[-2^(w-1), 2^(w-1)) congruent to it (`wrap`); `to_unsigned` / `from_unsigned`
convert to and from the residues [0, 2^w) that secure aggregation masks and
sums (2 <= w <= 62). Noise is never clipped: a device's noisy vector is
reduced mod 2^w as it is, and so is the sum; a value leaves no trace of
having wrapped once the sum is back inside the range.

Decoding is right when every coordinate of the true (unreduced) sum lies in
[-2^(w-1), 2^(w-1)). For n devices, each with a clipped update of norm
<= c, scale s, a shared rotation R drawn independently of the updates,
randomised rounding and N_Z(0, sigma^2) noise per coordinate, the true sum's
coordinate j is

    S_j = s (R sum_i x_i)_j + E_j + N_j,   |E_j| < n (rounding),

where s (R sum x_i)_j is sub-Gaussian with variance proxy (n s c)^2 / d'
(Hoeffding over the signs of R; ||sum x_i|| <= n c) and N_j, a sum of n
independent discrete Gaussians, is sub-Gaussian with proxy n sigma^2
(Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential
Privacy", 2020). With v = (n s c)^2 / d' + n sigma^2 and L = 2^(w-1), a union
bound over the d' coordinates gives

    P[some coordinate wraps] <= 2 d' exp(-(L - n)^2 / (2 v))   (L > n).

`overflow_bound` computes it; `check_field` refuses a configuration above a
target with a message that names the smallest sufficient w.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from dpmech.random_source import I64

MIN_BITS, MAX_BITS = 2, 62
U64 = npt.NDArray[np.uint64]


def _check_bits(bits: int) -> None:
    if not (isinstance(bits, int) and MIN_BITS <= bits <= MAX_BITS):
        raise ValueError(f"field bits must be an int in [{MIN_BITS}, {MAX_BITS}], got {bits!r}")


def wrap(x: I64, bits: int) -> I64:
    """x mod 2^bits, as the representative in [-2^(bits-1), 2^(bits-1))."""
    _check_bits(bits)
    half = np.int64(1 << (bits - 1))
    return ((x + half) & np.int64((1 << bits) - 1)) - half


def to_unsigned(x: I64, bits: int) -> U64:
    """The residues of x in [0, 2^bits) (what a secure sum adds mod 2^bits)."""
    _check_bits(bits)
    return (x & np.int64((1 << bits) - 1)).astype(np.uint64)


def from_unsigned(u: npt.NDArray[np.unsignedinteger], bits: int) -> I64:
    """The centred representatives of residues u (any unsigned dtype; reduced mod 2^bits first)."""
    _check_bits(bits)
    low = (u.astype(np.uint64) & np.uint64((1 << bits) - 1)).astype(np.int64)
    return wrap(low, bits)


def sum_variance_proxy(devices: int, scaled_clip: float, padded_dim: int, sigma2: float) -> float:
    """v = (n C)^2 / d' + n sigma^2: the sub-Gaussian proxy of a true sum's coordinate."""
    if devices < 1 or padded_dim < 1 or scaled_clip < 0 or sigma2 < 0:
        raise ValueError("need devices >= 1, padded_dim >= 1, scaled_clip >= 0 and sigma2 >= 0")
    return (devices * scaled_clip) ** 2 / padded_dim + devices * sigma2


def overflow_bound(devices: int, scaled_clip: float, padded_dim: int, sigma2: float, bits: int) -> float:
    """An upper bound on P[some coordinate of the true sum of `devices` inputs
    leaves [-2^(bits-1), 2^(bits-1))] (module doc); 1.0 when it says nothing."""
    _check_bits(bits)
    margin = (1 << (bits - 1)) - devices
    if margin <= 0:
        return 1.0
    v = sum_variance_proxy(devices, scaled_clip, padded_dim, sigma2)
    if v == 0:
        return 0.0
    return min(1.0, 2 * padded_dim * math.exp(-(margin ** 2) / (2 * v)))


def smallest_bits(devices: int, scaled_clip: float, padded_dim: int, sigma2: float, target: float) -> int | None:
    """The smallest w in [2, 62] whose overflow bound is <= target, or None."""
    for bits in range(MIN_BITS, MAX_BITS + 1):
        if overflow_bound(devices, scaled_clip, padded_dim, sigma2, bits) <= target:
            return bits
    return None


def check_field(devices: int, scaled_clip: float, padded_dim: int, sigma2: float, bits: int, target: float) -> float:
    """The overflow bound, or ValueError naming what would fit when it exceeds `target`."""
    if not 0 < target < 1:
        raise ValueError(f"the overflow target must be in (0, 1), got {target}")
    bound = overflow_bound(devices, scaled_clip, padded_dim, sigma2, bits)
    if bound > target:
        need = smallest_bits(devices, scaled_clip, padded_dim, sigma2, target)
        fix = f"w >= {need} bits" if need is not None else "no field up to 2^62; lower the scale or the noise"
        raise ValueError(
            f"a field of 2^{bits} is too small for {devices} devices with noise sigma^2 = {sigma2:.4g} and "
            f"scaled clip {scaled_clip:.4g} in {padded_dim} coordinates: the true sum wraps with probability "
            f"up to {bound:.3g} > {target:.3g}; need {fix}, or a smaller scale")
    return bound
