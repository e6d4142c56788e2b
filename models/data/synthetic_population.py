"""The interactions of the synthetic population, made in blocks of users.

`models/data/synthetic.py` describes the model (latent factors, Gumbel-top-k
over affinity plus popularity, log-normal counts per user, ratings cut at
fixed quantiles, increasing timestamps). This module makes its four columns
without ever holding a dense users x items array: the affinities, the keys
and the top-k are computed `block_users` users at a time, so memory is
O(block_users x items + interactions + (users + items) x rank).

Contract: the output depends on the seed and the shape, not on the block
size. Every random draw comes from one generator in the same order as a
dense draw would (latent factors, counts, then the Gumbel noise row by row,
then the ratings' noise and the timestamps), and the mean and standard
deviation of all affinities are sums of per-user sums added exactly
(`math.fsum`), so they do not depend on how users are grouped. Each block's
matrix product is computed row by row the same way whatever the block's
height (BLAS), which the tests check on shapes with ragged blocks.

The stages, in the generator's order:

1. `draw_latent(rng, shape)`: factors, biases, item popularity and the
   per-user counts (`counts` alone decides the number of interactions, so it
   is cheap to check a shape's size before generating it);
2. `choose_items(rng, shape, latent, ...)`: each user's items (Gumbel-top-k,
   in descending key order) and their affinities, block by block, with an
   optional progress callback (users done, users in all);
3. `rate_and_time(rng, shape, latent, item, affinity)`: ratings, the order of
   each user's items and the timestamps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

_RATING_CUTS = np.array([0.06, 0.17, 0.44, 0.78])  # cumulative shares of ratings 1..4
#: cells (users x items) of one block's dense arrays by default: 128 MB per float64 array
BLOCK_CELLS = 1 << 24


@dataclass(frozen=True)
class Shape:
    """What the population looks like (see `models.data.synthetic.synthetic` for each knob)."""

    n_users: int
    n_items: int
    rank: int = 8
    mean_interactions: float = 25.0
    min_interactions: int = 10
    max_interactions: int | None = None
    popularity: float = 0.8
    affinity_weight: float = 2.0
    rating_noise: float = 0.35

    def __post_init__(self) -> None:
        if self.n_users < 1 or self.n_items < 2:
            raise ValueError("need at least 1 user and 2 items")
        if self.rank < 1:
            raise ValueError(f"rank must be >= 1, not {self.rank}")
        if not (math.isfinite(self.mean_interactions) and self.mean_interactions > 0):
            raise ValueError(f"mean_interactions must be a number > 0, not {self.mean_interactions}")
        if self.min_interactions < 1:
            raise ValueError(f"min_interactions must be >= 1, not {self.min_interactions}")
        if self.max_interactions is not None and self.max_interactions < 1:
            raise ValueError(f"max_interactions must be >= 1, not {self.max_interactions}")

    @property
    def count_bounds(self) -> tuple[int, int]:
        """(fewest, most) interactions of a user. `max_interactions` defaults to
        min(n_items // 3, n_items - 101); both are capped at n_items."""
        m = self.n_items
        hi = self.max_interactions if self.max_interactions is not None else min(m // 3, m - 101)
        hi = max(min(hi, m), 1)
        return min(self.min_interactions, hi), hi


@dataclass(frozen=True)
class Latent:
    """The population's latent draws: factors p (users, rank), q (items, rank),
    biases, log-popularity of every item, and each user's count."""

    p: np.ndarray
    q: np.ndarray
    ub: np.ndarray
    ib: np.ndarray
    log_pop: np.ndarray
    counts: np.ndarray  # int64 (n_users,), each within Shape.count_bounds


def draw_latent(rng: np.random.Generator, s: Shape) -> Latent:
    """Stage 1: factors, biases, popularity and per-user counts (log-normal around
    `mean_interactions`, rounded, clipped to `count_bounds`)."""
    p = rng.standard_normal((s.n_users, s.rank))
    q = rng.standard_normal((s.n_items, s.rank))
    ub = 0.3 * rng.standard_normal(s.n_users)
    ib = 0.3 * rng.standard_normal(s.n_items)
    log_pop = -s.popularity * np.log1p(rng.permutation(s.n_items))
    lo, hi = s.count_bounds
    counts = np.clip(np.round(rng.lognormal(np.log(s.mean_interactions), 0.6, s.n_users)), lo, hi).astype(np.int64)
    return Latent(p, q, ub, ib, log_pop, counts)


def _affinity(lat: Latent, rank: int, lo: int, hi: int) -> np.ndarray:
    """Affinities of users lo..hi-1 with every item, (hi - lo, n_items) float64."""
    return lat.p[lo:hi] @ lat.q.T / np.sqrt(rank) + lat.ub[lo:hi, None] + lat.ib[None, :]


def _blocks(n_users: int, block_users: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + block_users, n_users)) for lo in range(0, n_users, block_users)]


def affinity_moments(lat: Latent, rank: int, block_users: int) -> tuple[float, float]:
    """Mean and (population) standard deviation of every user-item affinity, two passes over
    the blocks; per-user sums added exactly, so the result does not depend on `block_users`."""
    n, m = len(lat.p), len(lat.q)
    blocks = _blocks(n, block_users)
    mean = math.fsum(s for lo, hi in blocks for s in _affinity(lat, rank, lo, hi).sum(axis=1).tolist()) / (n * m)
    sq = math.fsum(
        s for lo, hi in blocks for s in np.square(_affinity(lat, rank, lo, hi) - mean).sum(axis=1).tolist()
    )
    return mean, math.sqrt(sq / (n * m))


def default_block_users(n_items: int) -> int:
    """Users per block so that one block's dense array has about `BLOCK_CELLS` cells."""
    return max(1, BLOCK_CELLS // n_items)


def choose_items(
    rng: np.random.Generator,
    s: Shape,
    lat: Latent,
    *,
    block_users: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Stage 2: (item, affinity) of every interaction, user-major, each user's
    `counts[u]` items in descending Gumbel key (the Gumbel-top-k of
    `affinity_weight * standardised affinity + log_pop`). `progress(done, n_users)`
    is called once with done = 0 when the blocks start (after the two passes that
    standardise the affinities) and after each block."""
    b = default_block_users(s.n_items) if block_users is None else block_users
    if b < 1:
        raise ValueError(f"block_users must be >= 1, not {b}")
    mean, std = affinity_moments(lat, s.rank, b)
    if progress is not None:
        progress(0, s.n_users)
    items: list[np.ndarray] = []
    affs: list[np.ndarray] = []
    for lo, hi in _blocks(s.n_users, b):
        aff = _affinity(lat, s.rank, lo, hi)
        keys = s.affinity_weight * (aff - mean) / std + lat.log_pop[None, :]
        keys += rng.gumbel(size=keys.shape)
        counts = lat.counts[lo:hi]
        c = int(counts.max())
        top = np.argpartition(keys, s.n_items - c, axis=1)[:, s.n_items - c :]
        order = np.argsort(-np.take_along_axis(keys, top, axis=1), axis=1)
        top = np.take_along_axis(top, order, axis=1)  # each row's c best, best first
        take = np.arange(c)[None, :] < counts[:, None]
        items.append(top[take])
        affs.append(np.take_along_axis(aff, top, axis=1)[take])
        if progress is not None:
            progress(hi, s.n_users)
    return np.concatenate(items).astype(np.int64), np.concatenate(affs)


def rate_and_time(
    rng: np.random.Generator, s: Shape, lat: Latent, item: np.ndarray, affinity: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Stage 3: (user, item, rating, timestamp), user-major. Ratings 1..5: the
    standardised affinity plus noise, cut at fixed quantiles; each user's items in a
    random order with increasing timestamps (random gaps, some zero: ties)."""
    counts = lat.counts
    n_obs = len(item)
    user = np.repeat(np.arange(s.n_users), counts)
    a = affinity
    z = (a - a.mean()) / (a.std() + 1e-12) + s.rating_noise * rng.standard_normal(n_obs)
    cuts = np.quantile(z, _RATING_CUTS)
    rating = (1 + np.searchsorted(cuts, z, side="right")).astype(np.float32)
    del z
    start = 880_000_000 + rng.integers(0, 20_000_000, s.n_users)
    gaps = rng.integers(0, 4000, n_obs) * (rng.random(n_obs) > 0.15)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    csum = np.cumsum(gaps)
    within = csum - np.repeat(csum[first] - gaps[first], counts)
    del csum, gaps
    perm = np.lexsort((rng.random(n_obs), user))  # shuffle items within each user
    user, item, rating = user[perm], item[perm], rating[perm]
    timestamp = (np.repeat(start, counts) + within).astype(np.int64)
    return user.astype(np.int64), item.astype(np.int64), rating, timestamp
