"""The canary estimator (dpmech/audit.py) against independent oracles:
Gaussian differential privacy's closed form (Dong, Roth and Su, "Gaussian
Differential Privacy", 2022) for equal variances, numerical integration of
the hockey-stick divergence for unequal ones, scipy's log_ndtr."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from scipy import integrate, special, stats

from dpmech import audit


def gdp_delta(eps: float, mu: float) -> float:
    """delta(eps) of mu-GDP: Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)."""
    return float(stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2))


@pytest.mark.parametrize("x", [3.0, 0.0, -1.5, -10.0, -29.9, -30.1, -45.0, -200.0])
def test_log_ndtr_matches_scipy_far_into_the_tail(x: float) -> None:
    assert audit.log_ndtr(x) == pytest.approx(float(special.log_ndtr(x)), rel=1e-9)


@pytest.mark.parametrize("mu", [0.3, 1.0, 2.0, 5.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-8])
def test_equal_variances_give_the_gaussian_mechanisms_epsilon(mu: float, delta: float) -> None:
    eps = audit.gaussian_pair_epsilon((0.1, 2.0), (0.1 + 2.0 * mu, 2.0), delta)  # shift mu sds, any location
    assert gdp_delta(eps, mu) == pytest.approx(delta, rel=1e-4)
    assert audit.gaussian_pair_epsilon((0.0, 1.0), (-mu, 1.0), delta) == pytest.approx(eps, rel=1e-5)  # symmetric


def test_a_large_shift_stays_finite_and_monotone() -> None:
    eps = [audit.gaussian_pair_epsilon((0, 1), (mu, 1), 1e-5) for mu in (10.0, 20.0, 40.0)]
    assert eps[0] < eps[1] < eps[2] < audit.EPSILON_CAP
    assert gdp_delta(eps[0], 10.0) == pytest.approx(1e-5, rel=1e-3)
    assert audit.gaussian_pair_epsilon((0, 1), (1e6, 1), 1e-5) == audit.EPSILON_CAP


@pytest.mark.parametrize(("null", "shifted", "eps"), [((0.0, 1.0), (1.0, 1.2), 1.0), ((0.0, 1.0), (0.5, 0.8), 0.3),
                                                       ((0.2, 0.5), (0.9, 0.6), 2.5)])
def test_unequal_variances_match_a_numerical_hockey_stick(null: tuple[float, float], shifted: tuple[float, float],
                                                          eps: float) -> None:
    def numeric(p: tuple[float, float], q: tuple[float, float]) -> float:
        lo = min(p[0], q[0]) - 40 * max(p[1], q[1])
        hi = max(p[0], q[0]) + 40 * max(p[1], q[1])
        f = lambda x: max(0.0, stats.norm.pdf(x, *p) - math.exp(eps) * stats.norm.pdf(x, *q))  # noqa: E731
        return float(integrate.quad(f, lo, hi, limit=500, points=[p[0], q[0]])[0])

    expected = max(numeric(shifted, null), numeric(null, shifted))
    assert audit.gaussian_pair_delta(eps, null, shifted) == pytest.approx(expected, rel=1e-6, abs=1e-12)


def test_no_shift_and_equal_variances_is_epsilon_zero() -> None:
    assert audit.gaussian_pair_epsilon((0.0, 1.0), (0.0, 1.0), 1e-5) == 0.0


def test_the_estimate_of_gaussian_samples_covers_the_true_epsilon() -> None:
    """Cosines drawn from the model itself, shift mu = 1.5: the interval
    covers the mechanism's epsilon, the point is close to it."""
    rng = np.random.default_rng(7)
    mu, sd, n = 1.5, 0.01, 2000
    truth = audit.gaussian_pair_epsilon((0, 1), (mu, 1), 1e-5)
    e = audit.estimate(rng.normal(mu * sd, sd, n), rng.normal(0, sd, n), delta=1e-5, rng=rng, resamples=400)
    assert e.low <= truth <= e.high
    assert e.epsilon == pytest.approx(truth, rel=0.1)
    assert e.separation == pytest.approx(mu, rel=0.05)
    assert e.n_inserted == e.n_held_out == n and e.equal_variances


def test_the_separate_fit_is_biased_upward_at_small_delta() -> None:
    """Why `pooled` is the default (D92): with the paper's separate sds a
    sampling error in either sd widens the tails' ratio, and at delta 1e-5
    the estimates of the true mechanism's samples sit above its epsilon."""
    rng = np.random.default_rng(3)
    truth = audit.gaussian_pair_epsilon((0, 1), (1.0, 1), 1e-5)
    pooled, separate = [], []
    for _ in range(40):
        a, b = rng.normal(1.0, 1, 1000), rng.normal(0, 1, 1000)
        pooled.append(audit.gaussian_pair_epsilon(*audit.fit_pair(a, b, equal_variances=True), 1e-5))
        separate.append(audit.gaussian_pair_epsilon(*audit.fit_pair(a, b, equal_variances=False), 1e-5))
    assert abs(np.mean(pooled) - truth) < 0.05 * truth
    assert np.mean(separate) > 1.05 * truth


def test_verdicts() -> None:
    e = audit.EmpiricalEpsilon(epsilon=5.0, low=4.0, high=6.0, confidence=0.95, delta=1e-5, inserted=(1.0, 1.0),
                               held_out=(0.0, 1.0), n_inserted=10, n_held_out=10, resamples=10, equal_variances=True)
    assert e.verdict(5.0) is audit.Verdict.CONSISTENT
    assert e.verdict(4.5) is audit.Verdict.ABOVE_NOT_SIGNIFICANT
    assert e.verdict(4.0) is audit.Verdict.ABOVE_NOT_SIGNIFICANT
    assert e.verdict(3.9) is audit.Verdict.EXCEEDS


def test_cosines_and_directions() -> None:
    rng = np.random.default_rng(0)
    d = audit.random_directions(rng, 5, 64)
    assert np.allclose(np.linalg.norm(d, axis=1), 1.0)
    release = 3.0 * d[2]
    assert audit.cosines(release, d)[2] == pytest.approx(1.0)
    assert audit.cosines(release, 2 * d) == pytest.approx(audit.cosines(release, d))


@pytest.mark.parametrize(("call", "message"), [
    (lambda: audit.cosines(np.zeros(4), np.ones((2, 4))), "zero or not finite"),
    (lambda: audit.cosines(np.ones(3), np.ones((2, 4))), "rows of its length"),
    (lambda: audit.gaussian_pair_epsilon((0, 1), (1, 1), 0.0), "delta must be in"),
    (lambda: audit.gaussian_pair_epsilon((0, 0), (1, 1), 1e-5), "positive sd"),
    (lambda: audit.gaussian_fit(np.array([1.0])), ">= 2 finite values"),
    (lambda: audit.gaussian_fit(np.array([1.0, 1.0])), "no spread"),
    (lambda: audit.estimate(np.ones(3), np.ones(3), delta=1e-5, rng=np.random.default_rng(), resamples=5),
     ">= 10 resamples"),
    (lambda: audit.random_directions(np.random.default_rng(), 0, 4), "count >= 1"),
])
def test_bad_input_is_refused(call: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
