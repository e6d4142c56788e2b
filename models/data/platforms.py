"""Platform-level federation data: M platforms made by Dirichlet label skew (FREIB).

The protocol of "Federated Recommendation with Explicitly Encoding Item Bias"
(Wang et al., AAAI 2025), as written there and made precise here:

1. drop users with fewer than `min_ratings` (5) ratings (a repeated
   (user, item) pair counts once, its latest rating);
2. split the ratings at random 80/20 into training and test (one seeded draw
   over all ratings, not per user: the paper's "randomly split with the ratio
   of 8:2");
3. put every user on exactly one of M platforms by Dirichlet label skew with
   parameter beta: a user's label is its rating level nearest to the mean of
   its *training* ratings; for every label c, proportions p_c ~ Dir(beta 1_M)
   are drawn and the users of label c (in a seeded random order) are cut into
   M consecutive groups of sizes ~ p_c * n_c (Hsu et al. 2019's label-skew
   partition, applied to users so that a platform owns all of a user's
   ratings). Smaller beta = more skew. The draw is repeated (next seed word)
   until every platform has at least `min_users` users;
4. carve a validation part out of each platform's training ratings: a seeded
   random `val_fraction` (10%) of them. Hyperparameters are chosen on it; the
   test part is scored once.

Everything is a pure function of (interactions, M, beta, seed, fractions).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.data.loaders import filter_users
from models.data.splits import dedupe_latest
from models.data.types import Interactions

MIN_RATINGS = 5
_MAX_DIRICHLET_DRAWS = 1000
# independent sub-streams of the split's seed
_TAG_TEST, _TAG_PLATFORM, _TAG_VAL = 11, 12, 13


@dataclass(frozen=True)
class Ratings:
    """Parallel arrays of (user, item, rating) records."""

    user: np.ndarray  # int64
    item: np.ndarray  # int64
    rating: np.ndarray  # float32

    def __len__(self) -> int:
        return len(self.user)

    def take(self, rows: np.ndarray) -> Ratings:
        return Ratings(self.user[rows], self.item[rows], self.rating[rows])


@dataclass(frozen=True)
class PlatformSplit:
    """Users on M platforms; train/validation/test ratings (see the module doc).

    Contracts: `user_platform[u]` in 0..M-1 for every user; a user's ratings of
    every part lie on its platform; `levels` are the distinct rating values of
    the data, ascending (the prototypes' rating levels).
    """

    n_users: int
    n_items: int
    n_platforms: int
    beta: float
    seed: int
    user_platform: np.ndarray  # int64 (n_users,)
    levels: np.ndarray  # float32 (K,)
    train: Ratings
    val: Ratings
    test: Ratings
    rating_range: tuple[float, float]

    def platform_of(self, part: Ratings) -> np.ndarray:
        return self.user_platform[part.user]

    def platform_sizes(self) -> np.ndarray:
        """(M,) training ratings per platform."""
        return np.bincount(self.platform_of(self.train), minlength=self.n_platforms)

    def label_distribution(self, part: Ratings | None = None) -> np.ndarray:
        """(M, K) share of each rating level among each platform's ratings of `part` (train by default)."""
        p = self.train if part is None else part
        lv = level_index(self.levels, p.rating)
        counts = np.zeros((self.n_platforms, len(self.levels)))
        np.add.at(counts, (self.platform_of(p), lv), 1.0)
        return counts / np.maximum(counts.sum(1, keepdims=True), 1.0)


def level_index(levels: np.ndarray, ratings: np.ndarray) -> np.ndarray:
    """Index of the level nearest to each rating (ties to the lower level)."""
    lv = np.asarray(levels, dtype=np.float64)
    r = np.asarray(ratings, dtype=np.float64)
    hi = np.clip(np.searchsorted(lv, r), 1, len(lv) - 1) if len(lv) > 1 else np.zeros(len(r), dtype=np.int64)
    if len(lv) == 1:
        return hi.astype(np.int64)
    lo = hi - 1
    return np.where(np.abs(r - lv[lo]) <= np.abs(lv[hi] - r), lo, hi).astype(np.int64)


def _rng(seed: int, tag: int, attempt: int = 0) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed) & ((1 << 63) - 1), tag, attempt]))


def dirichlet_user_platforms(
    labels: np.ndarray,
    n_platforms: int,
    beta: float,
    seed: int,
    *,
    min_users: int = 1,
) -> np.ndarray:
    """(n,) platform of each of n users with class `labels` (int, >= 0), by
    Dirichlet label skew (module doc, step 3). Raises ValueError when no draw
    gives every platform `min_users` users."""
    if n_platforms < 1:
        raise ValueError(f"n_platforms must be >= 1, got {n_platforms}")
    if not beta > 0:
        raise ValueError(f"the Dirichlet parameter beta must be > 0, got {beta}")
    labels = np.asarray(labels, dtype=np.int64)
    n = len(labels)
    if n < n_platforms * min_users:
        raise ValueError(f"{n} users cannot give {n_platforms} platforms {min_users} users each")
    classes = np.unique(labels)
    for attempt in range(_MAX_DIRICHLET_DRAWS):
        rng = _rng(seed, _TAG_PLATFORM, attempt)
        out = np.empty(n, dtype=np.int64)
        for c in classes:
            members = np.flatnonzero(labels == c)
            members = members[rng.permutation(len(members))]
            p = rng.dirichlet(np.full(n_platforms, float(beta)))
            cuts = (np.cumsum(p)[:-1] * len(members)).astype(np.int64)
            for m, part in enumerate(np.split(members, cuts)):
                out[part] = m
        if np.bincount(out, minlength=n_platforms).min() >= min_users:
            return out
    raise ValueError(
        f"no Dirichlet draw (beta {beta}) in {_MAX_DIRICHLET_DRAWS} gave each of {n_platforms} platforms "
        f"{min_users} users; lower --platforms or raise beta"
    )


def make_platform_split(
    interactions: Interactions,
    *,
    n_platforms: int,
    beta: float,
    seed: int,
    min_ratings: int = MIN_RATINGS,
    test_fraction: float = 0.2,
    val_fraction: float = 0.1,
    min_users: int = 10,
) -> PlatformSplit:
    """The FREIB protocol's split (module doc). `min_users` is lowered to what
    the data allows (n_users // n_platforms) for tiny datasets."""
    if not 0 < test_fraction < 1 or not 0 <= val_fraction < 1:
        raise ValueError("test_fraction must be in (0, 1) and val_fraction in [0, 1)")
    x = filter_users(interactions, min_ratings)
    if x.n_users == 0:
        raise ValueError(f"no user of {interactions.name} has {min_ratings} ratings")
    rows = dedupe_latest(x)
    user, item, rating = x.user[rows].astype(np.int64), x.item[rows].astype(np.int64), x.rating[rows].astype(np.float32)
    levels = np.unique(rating).astype(np.float32)

    n = len(rows)
    n_test = int(round(test_fraction * n))
    perm = _rng(seed, _TAG_TEST).permutation(n)
    is_test = np.zeros(n, dtype=bool)
    is_test[perm[:n_test]] = True
    train_all = np.flatnonzero(~is_test)

    # label of a user: the level nearest to its mean training rating (users
    # without a training rating: nearest to their mean rating overall)
    sums = np.bincount(user[train_all], weights=rating[train_all], minlength=x.n_users)
    cnt = np.bincount(user[train_all], minlength=x.n_users)
    sums_all = np.bincount(user, weights=rating, minlength=x.n_users)
    cnt_all = np.bincount(user, minlength=x.n_users)
    mean = np.where(cnt > 0, sums / np.maximum(cnt, 1), sums_all / np.maximum(cnt_all, 1))
    labels = level_index(levels, mean)
    min_u = max(1, min(min_users, x.n_users // n_platforms))
    platform = dirichlet_user_platforms(labels, n_platforms, beta, seed, min_users=min_u)

    # validation: a random val_fraction of each platform's training ratings
    keys = _rng(seed, _TAG_VAL).random(len(train_all))
    tp = platform[user[train_all]]
    order = np.lexsort((keys, tp))
    counts = np.bincount(tp, minlength=n_platforms)
    n_val = np.floor(val_fraction * counts + 0.5).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.empty(len(train_all), dtype=np.int64)
    rank[order] = np.arange(len(train_all)) - starts[tp[order]]
    is_val = rank < n_val[tp]

    allr = Ratings(user, item, rating)
    return PlatformSplit(
        n_users=x.n_users,
        n_items=x.n_items,
        n_platforms=n_platforms,
        beta=float(beta),
        seed=seed,
        user_platform=platform,
        levels=levels,
        train=allr.take(train_all[~is_val]),
        val=allr.take(train_all[is_val]),
        test=allr.take(np.flatnonzero(is_test)),
        rating_range=(float(levels.min()), float(levels.max())),
    )
