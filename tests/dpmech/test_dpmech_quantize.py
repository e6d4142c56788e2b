"""Clipping, and randomised rounding under the conditional norm bound: the
bound is enforced exactly, the rounding is unbiased, retries happen."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpmech.quantize import (DEFAULT_BETA, clip_l2, norm_bound_sq, round_randomly, round_within_bound,
                             squared_norms)


def test_clip_scales_only_long_rows() -> None:
    x = np.array([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    np.testing.assert_allclose(clip_l2(x, 1.0), [[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]])
    with pytest.raises(ValueError, match="NaN"):
        clip_l2(np.array([np.nan, 1.0]), 1.0)
    with pytest.raises(ValueError, match="clip"):
        clip_l2(x, 0.0)


def test_the_norm_bound_is_the_papers_formula() -> None:
    c, d = 1000.0, 65_536
    likely = c * c + d / 4 + math.sqrt(2 * math.log(1 / DEFAULT_BETA)) * (c + math.sqrt(d) / 2)
    assert norm_bound_sq(c, d) == math.floor(min((c + 256) ** 2, likely))
    assert norm_bound_sq(c, d, beta=0.0) == math.floor((c + 256) ** 2)
    assert norm_bound_sq(1.0, 4) == math.floor(min(9.0, 1 + 1 + math.sqrt(1.0) * 2.0))


def test_rounding_is_unbiased() -> None:
    rng = np.random.default_rng(0)
    z = np.array([0.25, -1.75, 3.5, 7.0])
    draws = np.stack([round_randomly(z, rng) for _ in range(20_000)])
    assert set(np.unique(draws[:, 0])) == {0, 1} and np.all(draws[:, 3] == 7)
    np.testing.assert_allclose(draws.mean(axis=0), z, atol=0.02)


def test_every_rounded_row_meets_the_bound_and_tight_bounds_retry() -> None:
    rng = np.random.default_rng(1)
    d, c = 1024, 50.0
    z = rng.normal(size=(40, d))
    z *= c / np.linalg.norm(z, axis=1, keepdims=True)
    bound = norm_bound_sq(c, d)
    free = [s for s in squared_norms(round_randomly(z, rng))]
    assert max(free) > c * c  # rounding grows the norm
    rounded = round_within_bound(z, bound, rng)
    assert all(s <= bound for s in squared_norms(rounded))
    assert np.all(np.abs(rounded - z) < 1)
    # A bound near the typical rounded norm: about half the tries fail, and still every row meets it.
    tight = int(np.median(free))
    assert all(s <= tight for s in squared_norms(round_within_bound(z, tight, rng)))


def test_the_bound_holds_per_try_with_probability_at_least_one_minus_beta() -> None:
    """The lemma behind B: a vector of norm C rounds within B in at least
    1 - beta of the tries (what bounds the retry loop's expected length);
    checked on a flat vector (every coordinate rounds) and a rotated one."""
    rng = np.random.default_rng(2)
    d, c = 4096, 20.0
    flat = np.full(d, c / math.sqrt(d))
    rotated = rng.normal(size=d)
    for z in (flat, rotated * c / np.linalg.norm(rotated)):
        rows = np.broadcast_to(z, (1000, d))
        ok = np.mean([s <= norm_bound_sq(c, d) for s in squared_norms(round_randomly(rows, rng))])
        assert ok >= 1 - DEFAULT_BETA


def test_an_unclipped_input_fails_loudly() -> None:
    z = np.full((1, 16), 10.0)
    with pytest.raises(RuntimeError, match="norm bound"):
        round_within_bound(z, 10, np.random.default_rng(0), max_tries=5)


def test_squared_norms_do_not_overflow() -> None:
    big = np.full((1, 4), 2 ** 40, dtype=np.int64)
    assert squared_norms(big) == [4 * 2 ** 80]
