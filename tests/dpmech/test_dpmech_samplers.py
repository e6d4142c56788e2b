"""The exact sampler draws N_Z(0, sigma^2) exactly, and the simulator's
seeded sampler draws the same law.

Oracle: the probability mass function, exp(-y^2 / (2 sigma^2)) normalised
(`dpmech.divergence.discrete_gaussian_pmf`), compared by a chi-square test
over bins with at least 20 expected draws (the tails pooled). The exact
sampler reads the operating system's CSPRNG, so its draws are not
reproducible: the tests accept at p > 1e-6 (a false alarm once in a
million runs) with enough draws that a wrong law is caught, which
`test_the_chi_square_check_catches_a_slightly_wrong_variance` shows.
"""

from __future__ import annotations

import ast
import math
from fractions import Fraction
from pathlib import Path
from typing import cast

import numpy as np
import pytest
from scipy import stats

from dpmech import exact_sampler, fast_sampler
from dpmech.divergence import discrete_gaussian_pmf
from dpmech.random_source import GeneratorBytes, SystemBytes, uniform_below

ROOT = Path(__file__).resolve().parents[2]
ALPHA = 1e-6


def _binned(draws: np.ndarray, sigma2: Fraction | float, min_expected: float = 20.0) -> tuple[np.ndarray, np.ndarray]:
    """Observed and expected counts over -R..R with the tails pooled into the end bins."""
    radius = math.ceil(40 * math.sqrt(float(sigma2))) + 10
    pmf = discrete_gaussian_pmf(sigma2, radius)
    n = draws.size
    keep = np.flatnonzero(pmf * n >= min_expected)
    lo, hi = int(keep[0]), int(keep[-1])
    expected = pmf[lo:hi + 1] * n
    expected[0] += pmf[:lo].sum() * n
    expected[-1] += pmf[hi + 1:].sum() * n
    clipped = np.clip(draws, lo - radius, hi - radius)
    observed = np.bincount(clipped - (lo - radius), minlength=hi - lo + 1).astype(np.float64)
    return observed, expected


def _p_value(draws: np.ndarray, sigma2: Fraction | float) -> float:
    observed, expected = _binned(draws, sigma2)
    return float(stats.chisquare(observed, expected * observed.sum() / expected.sum()).pvalue)


# (2^30 + 1) / 2^15: a fine denominator puts draws beyond about 2 sigma on
# the Python-integer acceptance path (|y| b t >= 2^31), so it is tested too.
FINE = Fraction(2 ** 30 + 1, 2 ** 15)


@pytest.mark.parametrize("sigma2", [Fraction(1, 4), Fraction(7, 3), Fraction(100), Fraction(40_000), FINE],
                         ids=["1/4", "7/3", "100", "40000", "fine-denominator"])
def test_the_exact_sampler_matches_the_pmf(sigma2: Fraction) -> None:
    a, b, t = exact_sampler.check_variance(sigma2)
    draws = exact_sampler.discrete_gaussian(200_000, sigma2, SystemBytes())
    if sigma2 == FINE:
        assert np.count_nonzero(np.abs(draws) * b * t >= 2 ** 31) > 1000  # the far path ran
    assert draws.dtype == np.int64 and draws.shape == (200_000,)
    assert _p_value(draws, sigma2) > ALPHA


def test_the_chi_square_check_catches_a_slightly_wrong_variance() -> None:
    """The check above has power: draws of sigma^2 = 105 fail as sigma^2 = 100."""
    draws = fast_sampler.discrete_gaussian(np.random.default_rng(3), 200_000, 105.0)
    assert _p_value(draws, Fraction(100)) < ALPHA
    assert _p_value(draws, Fraction(105)) > ALPHA


def test_the_seeded_sampler_matches_the_pmf_and_the_exact_sampler() -> None:
    rng = np.random.default_rng(11)
    for sigma2 in (Fraction(1, 4), Fraction(7, 3), Fraction(2500)):
        fast = fast_sampler.discrete_gaussian(rng, 200_000, sigma2)
        assert _p_value(fast, sigma2) > 1e-4  # seeded: deterministic
        exact = exact_sampler.discrete_gaussian(200_000, sigma2, SystemBytes())
        # The two samplers' draws against each other (two-sample chi-square, same bins).
        o_fast, _ = _binned(fast, sigma2)
        o_exact, _ = _binned(exact, sigma2)
        table = np.stack([o_fast, o_exact])
        table = table[:, table.sum(axis=0) > 0]
        assert stats.chi2_contingency(table).pvalue > ALPHA


def test_the_sum_of_seeded_shares_is_the_convolution() -> None:
    from dpmech.divergence import sum_log_pmf

    rng = np.random.default_rng(5)
    sigma2, devices, n = Fraction(1, 2), 3, 200_000
    draws = fast_sampler.sum_of_discrete_gaussians(rng, devices, n, sigma2)
    radius = 20
    pmf = np.exp(sum_log_pmf(sigma2, devices, radius))
    values = np.arange(-devices * radius, devices * radius + 1)
    keep = pmf * n >= 20
    observed = np.array([np.count_nonzero(draws == v) for v in values[keep]], dtype=np.float64)
    expected = pmf[keep] * n
    tails = n - observed.sum()
    observed, expected = np.append(observed, tails), np.append(expected, n - expected.sum())
    assert stats.chisquare(observed, expected).pvalue > 1e-4


@pytest.mark.parametrize("modulus", [2, 3, 5, 1000, 3 * 2 ** 20 + 1, 2 ** 61 + 12345])
def test_uniform_below_is_uniform(modulus: int) -> None:
    """Every lane width (1, 2, 4, 8 bytes): 16 value ranges hit as often as
    their exact sizes say."""
    n = 100_000
    draws = uniform_below(modulus, n, SystemBytes())
    assert draws.min() >= 0 and draws.max() < modulus
    buckets = min(16, modulus)
    edges = [modulus * i // buckets for i in range(buckets + 1)]
    observed = np.histogram(draws, bins=np.array(edges, dtype=np.float64))[0]
    expected = np.diff(np.array(edges, dtype=np.float64)) / modulus * n
    assert stats.chisquare(observed, expected).pvalue > ALPHA


def test_bernoulli_exp_minus_has_the_exact_probability() -> None:
    """P[1] = exp(-gamma) for gamma below, at and above 1 (exact source,
    seeded bytes so that the test replays): within 5 standard errors."""
    source = GeneratorBytes(np.random.default_rng(0))
    n = 100_000
    for whole, num, den in ((0, 1, 3), (0, 0, 1), (1, 0, 1), (2, 5, 7), (0, 999, 1000)):
        bits = exact_sampler.bernoulli_exp_minus(np.full(n, whole, dtype=np.int64),
                                                 np.full(n, num, dtype=np.int64), den, source)
        p = math.exp(-(whole + num / den))
        assert abs(bits.mean() - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-12, (whole, num, den)


def test_the_far_tail_acceptance_matches_the_vectorised_one() -> None:
    """The Python-integer path for draws whose exponent leaves int64 accepts
    with the same probability exp(-(|y| - sigma^2/t)^2 / (2 sigma^2))."""
    source = GeneratorBytes(np.random.default_rng(1))
    a, b, t = exact_sampler.check_variance(Fraction(9, 2))
    magnitude = 4  # t = 3: gamma = (4 - 3/2)^2 / 9 = 0.694...
    p = math.exp(-((magnitude - 1.5) ** 2) / 9)
    n = 6000
    far = np.array([exact_sampler._accept_far(magnitude, a, b, t, source) for _ in range(n)])
    assert abs(far.mean() - p) <= 5 * math.sqrt(p * (1 - p) / n)


def test_discrete_laplace_matches_its_pmf() -> None:
    source = SystemBytes()
    t, n = 3, 200_000
    draws = exact_sampler.discrete_laplace(n, t, source)
    values = np.arange(-40, 41)
    pmf = np.exp(-np.abs(values) / t)
    pmf /= pmf.sum()
    keep = pmf * n >= 20
    observed = np.array([np.count_nonzero(draws == v) for v in values[keep]], dtype=np.float64)
    observed = np.append(observed, n - observed.sum())
    expected = np.append(pmf[keep] * n, n - (pmf[keep] * n).sum())
    assert stats.chisquare(observed, expected).pvalue > ALPHA


def test_variances_outside_the_exact_range_are_refused() -> None:
    with pytest.raises(TypeError, match="Fraction"):
        exact_sampler.check_variance(cast(Fraction, 4.0))  # a float: the error under test
    with pytest.raises(ValueError, match="> 0"):
        exact_sampler.check_variance(Fraction(0))
    with pytest.raises(ValueError, match="too large"):
        exact_sampler.check_variance(Fraction(2 ** 40))
    assert exact_sampler.check_variance(Fraction(9, 4)) == (9, 4, 2)


def test_the_exact_sampler_uses_no_floating_point() -> None:
    """No float literal, true division, float() call or float function in the
    sampler's source (docstrings aside): its probabilities are integer ratios."""
    banned_calls = {"float", "exp", "log", "sqrt", "random", "uniform", "expm1"}
    for name in ("dpmech/exact_sampler.py", "dpmech/random_source.py"):
        tree = ast.parse((ROOT / name).read_text())
        for node in ast.walk(tree):
            assert not (isinstance(node, ast.Constant) and isinstance(node.value, float)), (name, node.lineno)
            assert not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)), (name, node.lineno)
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                assert called not in banned_calls, (name, node.lineno, called)


def test_one_draw_for_a_group_is_the_law_of_its_shares_sum() -> None:
    """`group_noise`'s shortcut (D95): from sigma^2 = 4 the sum of n shares and
    one N_Z(0, n sigma^2) agree outcome by outcome to 1e-12 (exact laws: the
    convolution of the pmfs against the pmf); at sigma^2 = 1/2 they do not,
    which is why smaller shares are drawn one by one."""
    from dpmech.divergence import sum_log_pmf

    devices, radius = 5, 60
    for sigma2, close in ((Fraction(4), True), (Fraction(1, 2), False)):
        conv = np.exp(sum_log_pmf(sigma2, devices, radius))
        one = discrete_gaussian_pmf(sigma2 * devices, devices * radius)
        centre = slice(devices * radius - 20, devices * radius + 21)  # within ~4.5 sd of the sum
        worst = float(np.max(np.abs(conv[centre] / one[centre] - 1)))
        assert (worst < 1e-12) if close else (worst > 1e-3), (sigma2, worst)
    # the draws follow the shares' sum law, and below the threshold they are the share-by-share draws
    draws = fast_sampler.group_noise(np.random.default_rng(4), devices, 200_000, Fraction(4))
    assert _p_value(draws, Fraction(4) * devices) > 1e-4
    small = fast_sampler.group_noise(np.random.default_rng(6), 3, 1000, Fraction(1, 2))
    assert np.array_equal(small, fast_sampler.sum_of_discrete_gaussians(np.random.default_rng(6), 3, 1000, Fraction(1, 2)))
    assert not fast_sampler.group_noise(np.random.default_rng(6), 0, 7, Fraction(4)).any()
