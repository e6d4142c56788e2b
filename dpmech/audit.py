"""Empirical epsilon from canaries: the estimator behind `fedmask audit` (D92).

Andrew, Kairouz, Oh, Oprea, McMahan and Suriyakumar, "One-shot Empirical
Privacy Estimation for Federated Learning" (ICLR 2024): a run inserts k
canary devices, each of whose updates is a fixed random unit direction c_j
(uniform on the sphere); k more directions are drawn the same way and never
inserted (held out). After the run, the auditor takes the cosine between the
released model delta (the sum of the decoded round updates) and every
direction. A held-out direction is independent of the release, so its
cosine follows the null law; an inserted canary's cosine is shifted by what
the release reveals about it. The paper's model: both laws are Gaussian,
N(mu0, s0^2) (held out) and N(mu1, s1^2) (inserted); the empirical epsilon
is the epsilon at delta of the mechanism whose outputs on neighbouring
inputs are those two Gaussians (`gaussian_pair_epsilon`, both directions of
the hockey-stick divergence, computed exactly with the normal CDF).

Contracts:

- `estimate` fits the two Gaussians by their sample means and standard
  deviations and returns the point estimate with a percentile bootstrap
  interval (the two samples resampled independently, with replacement).
- The estimate is of one run, under the Gaussian model: it is a lower
  bound's estimate for the strongest adversary of this statistic, not an
  upper bound on anything. An estimate ABOVE the accountant's epsilon whose
  interval lies wholly above it is evidence that the accountant (or the
  noise) is wrong (`Verdict`).
- Pure: numpy and the standard library; the randomness is the caller's
  Generator.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]

EPSILON_CAP = 1e4  # beyond this the estimate is reported as the cap (no finite bracket is needed)
_SQRT2 = math.sqrt(2.0)
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def random_directions(rng: np.random.Generator, count: int, dim: int) -> F64:
    """`count` directions uniform on the unit sphere of R^dim (rows)."""
    if count < 1 or dim < 2:
        raise ValueError(f"need count >= 1 and dim >= 2, got {count} and {dim}")
    g = rng.standard_normal((count, dim))
    rows: F64 = g / np.linalg.norm(g, axis=1, keepdims=True)
    return rows


def cosines(release: F64, directions: F64) -> F64:
    """The cosine between `release` (dim,) and each row of `directions` (k, dim)."""
    if release.ndim != 1 or directions.ndim != 2 or directions.shape[1] != release.shape[0]:
        raise ValueError(f"need a vector and rows of its length, got {release.shape} and {directions.shape}")
    norm = float(np.linalg.norm(release))
    if not (math.isfinite(norm) and norm > 0):
        raise ValueError("the release is zero or not finite: no cosine is defined")
    cos: F64 = (directions @ release) / (np.linalg.norm(directions, axis=1) * norm)
    return cos


def log_ndtr(x: float) -> float:
    """log Phi(x), the standard normal CDF, accurate far into the lower tail."""
    if x > -30.0:
        return math.log(0.5 * math.erfc(-x / _SQRT2))
    inv2 = 1.0 / (x * x)  # Phi(x) = phi(x)/|x| (1 - 1/x^2 + 3/x^4 - 15/x^6 ...), x -> -inf
    return -0.5 * x * x - math.log(-x) - _LOG_SQRT_2PI + math.log1p(-inv2 * (1 - 3 * inv2 * (1 - 5 * inv2)))


def _log_mass(lo: float, hi: float, mean: float, sd: float) -> float:
    """log P(lo < X < hi) for X ~ N(mean, sd^2) (lo, hi may be infinite); -inf if empty."""
    if not hi > lo:
        return -math.inf
    a, b = (lo - mean) / sd, (hi - mean) / sd
    if a > 0:  # both in the upper tail: use the mirrored lower tails, where log_ndtr is exact
        a, b = -b, -a
    upper = log_ndtr(b)
    if a == -math.inf:
        return upper
    lower = log_ndtr(a)
    return upper + math.log1p(-math.exp(min(0.0, lower - upper))) if lower < upper else -math.inf


def _region(eps: float, p: tuple[float, float], q: tuple[float, float]) -> list[tuple[float, float]]:
    """The set {x : log p(x) - log q(x) > eps} for p, q = (mean, sd), as intervals."""
    (m1, s1), (m0, s0) = p, q
    a = 1 / (2 * s0 * s0) - 1 / (2 * s1 * s1)
    b = m1 / (s1 * s1) - m0 / (s0 * s0)
    c = m0 * m0 / (2 * s0 * s0) - m1 * m1 / (2 * s1 * s1) + math.log(s0 / s1) - eps
    if abs(a) <= 1e-12 * (abs(b) * max(abs(m0), abs(m1), s0, s1) + 1 / (s0 * s0)):  # equal variances: linear
        if b == 0:
            return [(-math.inf, math.inf)] if c > 0 else []
        return [(-c / b, math.inf)] if b > 0 else [(-math.inf, -c / b)]
    disc = b * b - 4 * a * c
    if disc <= 0:
        return [(-math.inf, math.inf)] if a > 0 else []
    r = sorted(((-b - math.sqrt(disc)) / (2 * a), (-b + math.sqrt(disc)) / (2 * a)))
    return [(-math.inf, r[0]), (r[1], math.inf)] if a > 0 else [(r[0], r[1])]


def _hockey_stick(eps: float, p: tuple[float, float], q: tuple[float, float]) -> float:
    """sup_S P(S) - e^eps Q(S) for the Gaussians p, q = (mean, sd)."""
    total = 0.0
    for lo, hi in _region(eps, p, q):
        log_p, log_q = _log_mass(lo, hi, *p), _log_mass(lo, hi, *q)
        total += math.exp(log_p) - math.exp(min(eps + log_q, 700.0))
    return max(0.0, total)


def gaussian_pair_delta(eps: float, null: tuple[float, float], shifted: tuple[float, float]) -> float:
    """The delta at `eps` of a mechanism whose outputs on neighbours are the
    Gaussians `null` and `shifted` (mean, sd): both hockey-stick divergences' max."""
    return max(_hockey_stick(eps, shifted, null), _hockey_stick(eps, null, shifted))


def gaussian_pair_epsilon(null: tuple[float, float], shifted: tuple[float, float], delta: float) -> float:
    """The least epsilon >= 0 at which that mechanism is (epsilon, delta)-DP
    (bisection on the decreasing delta(epsilon)); `EPSILON_CAP` beyond it."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    for mean, sd in (null, shifted):
        if not (math.isfinite(mean) and math.isfinite(sd) and sd > 0):
            raise ValueError(f"each Gaussian needs a finite mean and a positive sd, got {(mean, sd)}")
    if gaussian_pair_delta(0.0, null, shifted) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while gaussian_pair_delta(hi, null, shifted) > delta:
        lo, hi = hi, 2 * hi
        if hi > EPSILON_CAP:
            return EPSILON_CAP
    for _ in range(60):  # to a relative precision far below the bootstrap's spread
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gaussian_pair_delta(mid, null, shifted) > delta else (lo, mid)
        if hi - lo <= 1e-6 * hi:
            break
    return hi


def gaussian_fit(sample: F64) -> tuple[float, float]:
    """(mean, sample standard deviation) of a 1-D sample of >= 2 finite values."""
    x = np.asarray(sample, dtype=np.float64)
    if x.ndim != 1 or x.size < 2 or not np.all(np.isfinite(x)):
        raise ValueError("a Gaussian fit needs >= 2 finite values")
    sd = float(x.std(ddof=1))
    if sd <= 0:
        raise ValueError("the sample has no spread: no Gaussian fits it")
    return float(x.mean()), sd


class Verdict(str, Enum):
    """What an estimate says of the accountant's epsilon."""

    CONSISTENT = "consistent"  # the estimate is at or below the accountant's epsilon
    ABOVE_NOT_SIGNIFICANT = "above, within the interval"  # above, but the interval reaches the accountant's
    EXCEEDS = "exceeds"  # the whole interval lies above: the accountant or the noise is wrong


@dataclass(frozen=True)
class EmpiricalEpsilon:
    """One audit's estimate: epsilon at `delta`, its bootstrap interval at
    `confidence`, the fitted Gaussians, and the sample sizes."""

    epsilon: float
    low: float
    high: float
    confidence: float
    delta: float
    inserted: tuple[float, float]  # (mean, sd) of the inserted canaries' cosines
    held_out: tuple[float, float]  # (mean, sd) of the held-out directions' cosines
    n_inserted: int
    n_held_out: int
    resamples: int
    equal_variances: bool

    @property
    def separation(self) -> float:
        """(mu1 - mu0) / pooled sd: the Gaussian-DP mu the fit amounts to."""
        (m1, s1), (m0, s0) = self.inserted, self.held_out
        return (m1 - m0) / math.sqrt((s1 * s1 + s0 * s0) / 2)

    def verdict(self, reported: float) -> Verdict:
        """Against the accountant's epsilon for the same run."""
        if self.low > reported:
            return Verdict.EXCEEDS
        return Verdict.ABOVE_NOT_SIGNIFICANT if self.epsilon > reported else Verdict.CONSISTENT

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["separation"] = self.separation
        return out


def fit_pair(inserted: F64, held_out: F64, *, equal_variances: bool) -> tuple[tuple[float, float], tuple[float, float]]:
    """(the held-out fit, the inserted fit), each (mean, sd); with
    `equal_variances` both take the pooled sd (the shift model of the
    Gaussian mechanism, whose noise moves both cosines alike)."""
    fit1, fit0 = gaussian_fit(inserted), gaussian_fit(held_out)
    if not equal_variances:
        return fit0, fit1
    n1, n0 = inserted.size, held_out.size
    pooled = math.sqrt(((n1 - 1) * fit1[1] ** 2 + (n0 - 1) * fit0[1] ** 2) / (n1 + n0 - 2))
    return (fit0[0], pooled), (fit1[0], pooled)


def estimate(inserted: F64, held_out: F64, *, delta: float, rng: np.random.Generator,
             confidence: float = 0.95, resamples: int = 1000, equal_variances: bool = True) -> EmpiricalEpsilon:
    """The empirical epsilon of the cosines of the inserted canaries against
    those of the held-out directions (see the module doc): the Gaussians
    share the pooled sd (`equal_variances`, the default) or each has its own
    (the paper's general fit, biased upward at small delta: a sampling
    error in the sds widens the tails' ratio; D92 gives the figures)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if resamples < 10:
        raise ValueError(f"the bootstrap needs >= 10 resamples, got {resamples}")
    ins, out = np.asarray(inserted, dtype=np.float64), np.asarray(held_out, dtype=np.float64)
    fit0, fit1 = fit_pair(ins, out, equal_variances=equal_variances)
    point = gaussian_pair_epsilon(fit0, fit1, delta)
    draws = np.empty(resamples)
    for i in range(resamples):
        b1 = ins[rng.integers(0, ins.size, ins.size)]
        b0 = out[rng.integers(0, out.size, out.size)]
        draws[i] = gaussian_pair_epsilon(*fit_pair(b1, b0, equal_variances=equal_variances), delta)
    tail = (1 - confidence) / 2
    low, high = (float(v) for v in np.quantile(draws, [tail, 1 - tail]))
    return EmpiricalEpsilon(epsilon=point, low=low, high=high, confidence=confidence, delta=delta, inserted=fit1,
                            held_out=fit0, n_inserted=int(ins.size), n_held_out=int(out.size), resamples=resamples,
                            equal_variances=equal_variances)


__all__ = ["EPSILON_CAP", "EmpiricalEpsilon", "Verdict", "cosines", "estimate", "gaussian_fit",
           "fit_pair", "gaussian_pair_delta", "gaussian_pair_epsilon", "log_ndtr", "random_directions"]
