"""A small, fast, seeded synthetic dataset with planted structure.

- Users and items have latent factors (rank `rank`); the affinity of user u for
  item i is <p_u, q_i> / sqrt(rank) plus user and item biases.
- Which items a user interacted with: Gumbel-top-k over
  `affinity_weight * affinity + popularity_i`, with popularity_i a Zipf-like
  log-popularity (exponent `popularity`), so interactions are both personal
  and popularity-skewed. Per-user counts are log-normal around
  `mean_interactions`, at least `min_interactions`.
- Ratings 1..5: the affinity of the chosen pairs, standardised, plus noise,
  cut at fixed quantiles (roughly MovieLens' 6/11/27/34/22 %).
- Timestamps: per user, increasing with small random gaps (some zero, so
  ties occur, like MovieLens' same-second ratings), in a random order of items.
- Side features named like the MovieLens ones, each a noisy function of the
  latent factors (so mask models have something to learn): user age bucket
  (7 one-hot), gender (2 one-hot), occupation (`n_occupations` one-hot); item
  genres (`n_genres` multi-hot, at least one per item), release year
  (z-scored) and its (always 0) missing flag.
"""

from __future__ import annotations

import numpy as np

from models.data import features as F
from models.data.types import Interactions

_RATING_CUTS = np.array([0.06, 0.17, 0.44, 0.78])  # cumulative shares of ratings 1..4


def _categorical(rng: np.random.Generator, latent: np.ndarray, n_cat: int, noise: float) -> np.ndarray:
    w = rng.standard_normal((latent.shape[1], n_cat))
    logits = latent @ w / np.sqrt(latent.shape[1]) + noise * rng.standard_normal((len(latent), n_cat))
    return logits.argmax(axis=1)


def synthetic(
    n_users: int = 200,
    n_items: int = 300,
    *,
    seed: int = 0,
    rank: int = 8,
    mean_interactions: float = 25.0,
    min_interactions: int = 10,
    max_interactions: int | None = None,
    popularity: float = 0.8,
    affinity_weight: float = 2.0,
    rating_noise: float = 0.35,
    n_occupations: int = 8,
    n_genres: int = 10,
    feature_noise: float = 0.5,
    name: str = "synthetic",
) -> Interactions:
    """Synthetic `Interactions` (default 200 users x 300 items, ~5k ratings, a few ms).

    `max_interactions` defaults to min(n_items // 3, n_items - 101), leaving every
    user 100 untouched items when n_items > 150 (what leave-one-out needs for
    99 negatives + a placebo).
    """
    if n_users < 1 or n_items < 2:
        raise ValueError("need at least 1 user and 2 items")
    rng = np.random.default_rng(seed)
    p = rng.standard_normal((n_users, rank))
    q = rng.standard_normal((n_items, rank))
    ub = 0.3 * rng.standard_normal(n_users)
    ib = 0.3 * rng.standard_normal(n_items)
    affinity = p @ q.T / np.sqrt(rank) + ub[:, None] + ib[None, :]

    pop_rank = rng.permutation(n_items)
    log_pop = -popularity * np.log1p(pop_rank)

    hi = max_interactions if max_interactions is not None else min(n_items // 3, n_items - 101)
    hi = max(min(hi, n_items), 1)
    lo = min(min_interactions, hi)
    counts = np.clip(
        np.round(rng.lognormal(np.log(mean_interactions), 0.6, n_users)), lo, hi
    ).astype(np.int64)

    logits = affinity_weight * (affinity - affinity.mean()) / affinity.std() + log_pop[None, :]
    keys = logits + rng.gumbel(size=logits.shape)
    ranked = np.argsort(-keys, axis=1)
    take = np.arange(n_items)[None, :] < counts[:, None]
    user = np.repeat(np.arange(n_users), counts)
    item = ranked[take]

    a = affinity[user, item]
    z = (a - a.mean()) / (a.std() + 1e-12) + rating_noise * rng.standard_normal(len(a))
    cuts = np.quantile(z, _RATING_CUTS)
    rating = (1 + np.searchsorted(cuts, z, side="right")).astype(np.float32)

    # timestamps: random order of each user's items, increasing, with some ties
    start = 880_000_000 + rng.integers(0, 20_000_000, n_users)
    gaps = rng.integers(0, 4000, len(user)) * (rng.random(len(user)) > 0.15)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    csum = np.cumsum(gaps)
    within = csum - np.repeat(csum[first] - gaps[first], counts)
    perm = np.lexsort((rng.random(len(user)), user))  # shuffle items within each user
    user, item, rating = user[perm], item[perm], rating[perm]
    timestamp = (np.repeat(start, counts) + within).astype(np.int64)

    # side features correlated with the latent factors
    age_values = np.array([15, 21, 30, 40, 47, 53, 60])
    age_bucket = _categorical(rng, p, len(age_values), feature_noise)
    age_oh, age_names = F.age_bucket_onehot(age_values[age_bucket])
    gender = np.where(p[:, 0] + feature_noise * rng.standard_normal(n_users) > 0, "M", "F")
    gender_oh, gender_names = F.onehot(gender.tolist(), "gender", ["F", "M"])
    occ = _categorical(rng, p, n_occupations, feature_noise)
    occ_oh = np.eye(n_occupations, dtype=np.float32)[occ]
    occ_names = tuple(f"occupation:occ{j}" for j in range(n_occupations))
    uf, ufn = F.concat([(age_oh, age_names), (gender_oh, gender_names), (occ_oh, occ_names)], n_users)

    g_w = rng.standard_normal((rank, n_genres))
    g_logit = q @ g_w / np.sqrt(rank) + feature_noise * rng.standard_normal((n_items, n_genres))
    genres = g_logit > np.quantile(g_logit, 0.8)
    genres[np.arange(n_items), g_logit.argmax(axis=1)] = True
    genre_names = tuple(f"genre:g{j}" for j in range(n_genres))
    year = 1990 + 8 * (q[:, 1] + feature_noise * rng.standard_normal(n_items))
    year_f, year_names = F.zscore_with_missing(np.round(year), "release_year")
    itf, ifn = F.concat([(genres.astype(np.float32), genre_names), (year_f, year_names)], n_items)

    return Interactions(
        name=name,
        user=user.astype(np.int64),
        item=item.astype(np.int64),
        rating=rating,
        timestamp=timestamp,
        n_users=n_users,
        n_items=n_items,
        raw_user_ids=np.arange(n_users, dtype=np.int64),
        raw_item_ids=np.arange(n_items, dtype=np.int64),
        user_features=uf,
        item_features=itf,
        user_feature_names=ufn,
        item_feature_names=ifn,
        item_titles=np.array([f"item {j}" for j in range(n_items)], dtype=object),
    )
