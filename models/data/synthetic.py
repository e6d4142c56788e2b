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
from models.data.synthetic_population import Shape, choose_items, draw_latent, rate_and_time
from models.data.types import Interactions


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
    block_users: int | None = None,
) -> Interactions:
    """Synthetic `Interactions` (default 200 users x 300 items, ~5k ratings, a few ms).

    `max_interactions` defaults to min(n_items // 3, n_items - 101), leaving every
    user 100 untouched items when n_items > 150 (what leave-one-out needs for
    99 negatives + a placebo). `block_users`: users per block of the dense
    work (models/data/synthetic_population.py); it changes memory, not the result.
    """
    shape = Shape(
        n_users, n_items, rank=rank, mean_interactions=mean_interactions, min_interactions=min_interactions,
        max_interactions=max_interactions, popularity=popularity, affinity_weight=affinity_weight,
        rating_noise=rating_noise,
    )  # fmt: skip
    rng = np.random.default_rng(seed)
    lat = draw_latent(rng, shape)
    item, affinity = choose_items(rng, shape, lat, block_users=block_users)
    user, item, rating, timestamp = rate_and_time(rng, shape, lat, item, affinity)
    p, q = lat.p, lat.q

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
