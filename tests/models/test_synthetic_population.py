"""The synthetic population made in blocks of users (models/data/synthetic_population.py)
against an independent dense oracle: the users x items algorithm it replaces, written out
here in full. Same seed, same draws, same columns, whatever the block size."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from models.data.synthetic import synthetic
from models.data.synthetic_population import Shape, choose_items, draw_latent, rate_and_time


def dense_oracle(s: Shape, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(user, item, rating, timestamp) computed on dense users x items arrays, one draw of each kind."""
    rng = np.random.default_rng(seed)
    p = rng.standard_normal((s.n_users, s.rank))
    q = rng.standard_normal((s.n_items, s.rank))
    ub = 0.3 * rng.standard_normal(s.n_users)
    ib = 0.3 * rng.standard_normal(s.n_items)
    affinity = p @ q.T / np.sqrt(s.rank) + ub[:, None] + ib[None, :]
    log_pop = -s.popularity * np.log1p(rng.permutation(s.n_items))
    lo, hi = s.count_bounds
    counts = np.clip(np.round(rng.lognormal(np.log(s.mean_interactions), 0.6, s.n_users)), lo, hi).astype(np.int64)
    logits = s.affinity_weight * (affinity - affinity.mean()) / affinity.std() + log_pop[None, :]
    ranked = np.argsort(-(logits + rng.gumbel(size=logits.shape)), axis=1)
    user = np.repeat(np.arange(s.n_users), counts)
    item = ranked[np.arange(s.n_items)[None, :] < counts[:, None]]
    a = affinity[user, item]
    z = (a - a.mean()) / (a.std() + 1e-12) + s.rating_noise * rng.standard_normal(len(a))
    rating = (1 + np.searchsorted(np.quantile(z, [0.06, 0.17, 0.44, 0.78]), z, side="right")).astype(np.float32)
    start = 880_000_000 + rng.integers(0, 20_000_000, s.n_users)
    gaps = rng.integers(0, 4000, len(user)) * (rng.random(len(user)) > 0.15)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    csum = np.cumsum(gaps)
    within = csum - np.repeat(csum[first] - gaps[first], counts)
    perm = np.lexsort((rng.random(len(user)), user))
    return user[perm], item[perm], rating[perm], np.repeat(start, counts) + within


SHAPES = [
    (Shape(120, 260), 5),
    (Shape(60, 50, min_interactions=2, mean_interactions=6.0, max_interactions=30), 1),
    (Shape(97, 333, mean_interactions=4.0, min_interactions=3, popularity=1.1, max_interactions=3000), 7),
    (Shape(30, 20, mean_interactions=40.0), 2),  # counts clipped at the default maximum
]


@pytest.mark.parametrize(("shape", "seed"), SHAPES)
@pytest.mark.parametrize("block_users", [1, 7, 64, None])
def test_blocks_give_the_dense_oracles_population(shape: Shape, seed: int, block_users: int | None) -> None:
    rng = np.random.default_rng(seed)
    lat = draw_latent(rng, shape)
    item, aff = choose_items(rng, shape, lat, block_users=block_users)
    got = rate_and_time(rng, shape, lat, item, aff)
    for mine, want in zip(got, dense_oracle(shape, seed), strict=True):
        np.testing.assert_array_equal(mine, want)
    user = got[0]
    per_user = np.bincount(user, minlength=shape.n_users)
    np.testing.assert_array_equal(per_user, lat.counts)
    lo, hi = shape.count_bounds
    assert per_user.min() >= lo and per_user.max() <= hi
    assert len(np.unique(user * shape.n_items + got[1])) == len(user)  # no item twice for a user


def test_synthetic_is_the_same_for_every_block_size() -> None:
    a, b = synthetic(90, 220, seed=7), synthetic(90, 220, seed=7, block_users=13)
    for field in ("user", "item", "rating", "timestamp", "user_features", "item_features"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))


def test_progress_reports_the_start_and_each_block() -> None:
    s = Shape(25, 120)
    rng = np.random.default_rng(0)
    calls: list[tuple[int, int]] = []
    choose_items(rng, s, draw_latent(rng, s), block_users=10, progress=lambda d, n: calls.append((d, n)))
    assert calls == [(0, 25), (10, 25), (20, 25), (25, 25)]


@pytest.mark.parametrize(
    ("make", "msg"),
    [
        (lambda: Shape(0, 20), "at least 1 user"),
        (lambda: Shape(10, 1), "2 items"),
        (lambda: Shape(10, 20, min_interactions=0), "min_interactions must be >= 1"),
        (lambda: Shape(10, 20, max_interactions=0), "max_interactions must be >= 1"),
        (lambda: Shape(10, 20, mean_interactions=0.0), "mean_interactions must be a number > 0"),
        (lambda: Shape(10, 20, mean_interactions=float("nan")), "mean_interactions must be a number > 0"),
        (lambda: Shape(10, 20, rank=0), "rank must be >= 1"),
    ],
)
def test_impossible_shapes_are_refused(make: Callable[[], Shape], msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        make()


def test_a_block_has_at_least_one_user() -> None:
    s = Shape(10, 20)
    rng = np.random.default_rng(0)
    lat = draw_latent(rng, s)
    with pytest.raises(ValueError, match="block_users must be >= 1"):
        choose_items(rng, s, lat, block_users=0)
