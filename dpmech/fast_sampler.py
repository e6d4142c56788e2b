"""The discrete Gaussian from a seeded numpy Generator: the simulator's sampler.

Same law as `dpmech.exact_sampler` (Algorithm 3 of Canonne, Kamath and
Steinke, "The Discrete Gaussian for Differential Privacy", 2020), drawn
with numpy's generator and floating-point acceptance probabilities instead
of a CSPRNG and rational arithmetic: reproducible from a seed and about as
fast as numpy's own samplers, but NOT for a device (its draws are
predictable from the seed, and its acceptance probabilities are rounded to
double precision, so its law matches the exact one to about 1e-16 per
outcome). tests/dpmech/test_samplers.py compares the two laws.

The discrete Laplace proposal is the difference of two independent
geometric variables on {0, 1, ...} with success probability 1 - exp(-1/t):
P[G1 - G2 = y] is proportional to exp(-|y| / t).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from dpmech.random_source import I64


def discrete_gaussian(rng: np.random.Generator, size: int | tuple[int, ...], sigma2: Fraction | float) -> I64:
    """Draws of N_Z(0, sigma2) with shape `size`, from `rng`."""
    s2 = float(sigma2)
    if not (math.isfinite(s2) and s2 > 0):
        raise ValueError(f"sigma^2 must be a positive finite number, got {sigma2}")
    shape = (size,) if isinstance(size, int) else size
    total = math.prod(shape)
    t = math.floor(math.sqrt(s2)) + 1
    p = -math.expm1(-1.0 / t)
    out = np.empty(total, dtype=np.int64)
    missing = total
    while missing > 0:
        batch = missing * 3 // 2 + 64
        y = (rng.geometric(p, batch) - rng.geometric(p, batch)).astype(np.int64)
        accept = rng.random(batch) < np.exp(-((np.abs(y) - s2 / t) ** 2) / (2.0 * s2))
        kept = y[accept][:missing]
        out[total - missing:total - missing + kept.size] = kept
        missing -= kept.size
    return out.reshape(shape)


def sum_of_discrete_gaussians(
    rng: np.random.Generator, count: int, size: int | tuple[int, ...], sigma2: Fraction | float,
) -> I64:
    """The sum of `count` independent N_Z(0, sigma2) arrays of shape `size`:
    the noise that `count` devices' shares put in a secure sum (drawn share
    by share, so it is that law exactly, not a Gaussian approximation)."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    shape = (size,) if isinstance(size, int) else size
    total = np.zeros(shape, dtype=np.int64)
    for _ in range(count):
        total += discrete_gaussian(rng, shape, sigma2)
    return total


#: From this share variance on, `group_noise` draws a sum of shares as one discrete Gaussian.
ONE_DRAW_MIN_SIGMA2 = 4


def group_noise(
    rng: np.random.Generator, count: int, size: int | tuple[int, ...], sigma2: Fraction | float,
) -> I64:
    """The noise `count` shares of N_Z(0, sigma2) put in one sum, drawn fast.

    For sigma2 >= ONE_DRAW_MIN_SIGMA2 (sigma >= 2) it is one draw of
    N_Z(0, count * sigma2): Kairouz, Liu and Steinke ("The Distributed
    Discrete Gaussian Mechanism for Federated Learning with Secure
    Aggregation", 2021) show the sum of the shares is within tau of that law,
    tau = 10 sum_{k<count} exp(-2 pi^2 sigma2 k/(k+1)) < 1e-16 at sigma >= 2
    (`dpmech.accounting.tau`, the term the accountant already prices), and
    tests/dpmech/test_dpmech_samplers.py compares the two exact laws. Its
    privacy is the single discrete Gaussian's, which the accountant's bound
    for the sum covers. Below that variance it draws share by share
    (`sum_of_discrete_gaussians`). Cost: one share's, whatever `count`."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    shape = (size,) if isinstance(size, int) else size
    if count == 0:
        return np.zeros(shape, dtype=np.int64)
    if Fraction(sigma2) < ONE_DRAW_MIN_SIGMA2:
        return sum_of_discrete_gaussians(rng, count, shape, sigma2)
    return discrete_gaussian(rng, shape, Fraction(sigma2) * count)
