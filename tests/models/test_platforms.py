"""The FREIB platform split: Dirichlet label skew over users, the random 80/20 split, validation per platform."""

from __future__ import annotations

import numpy as np
import pytest

from models.data.platforms import dirichlet_user_platforms, level_index, make_platform_split
from models.data.synthetic import synthetic


def test_each_user_on_exactly_one_platform_and_parts_partition_the_ratings() -> None:
    x = synthetic(n_users=120, n_items=80, seed=3, max_interactions=40)
    s = make_platform_split(x, n_platforms=5, beta=1.0, seed=7)
    assert s.user_platform.shape == (s.n_users,)
    assert set(np.unique(s.user_platform)) <= set(range(5))
    assert np.bincount(s.user_platform, minlength=5).min() >= 10
    n = len(s.train) + len(s.val) + len(s.test)
    pairs = set()
    for part in (s.train, s.val, s.test):
        pairs |= set(zip(part.user.tolist(), part.item.tolist(), strict=True))
    assert len(pairs) == n  # no (user, item) in two parts
    assert abs(len(s.test) / n - 0.2) < 0.01
    # validation is about 10% of each platform's training ratings
    tr = np.bincount(s.platform_of(s.train), minlength=5)
    va = np.bincount(s.platform_of(s.val), minlength=5)
    assert np.all(np.abs(va / (tr + va) - 0.1) < 0.02)


def test_seeded_and_seed_sensitive() -> None:
    x = synthetic(n_users=120, n_items=80, seed=3, max_interactions=40)
    a = make_platform_split(x, n_platforms=5, beta=0.5, seed=1)
    b = make_platform_split(x, n_platforms=5, beta=0.5, seed=1)
    c = make_platform_split(x, n_platforms=5, beta=0.5, seed=2)
    assert np.array_equal(a.user_platform, b.user_platform) and np.array_equal(a.test.item, b.test.item)
    assert not np.array_equal(a.user_platform, c.user_platform)


def _skew(labels: np.ndarray, platform: np.ndarray, m: int) -> float:
    """Mean total-variation distance between each platform's label distribution and the overall one."""
    k = labels.max() + 1
    overall = np.bincount(labels, minlength=k) / len(labels)
    tv = []
    for p in range(m):
        lab = labels[platform == p]
        if len(lab):
            tv.append(0.5 * np.abs(np.bincount(lab, minlength=k) / len(lab) - overall).sum())
    return float(np.mean(tv))


def test_beta_controls_label_skew() -> None:
    labels = np.repeat(np.arange(5), 400)
    skews = {}
    for beta in (0.1, 1.0, 100.0):
        skews[beta] = np.mean(
            [_skew(labels, dirichlet_user_platforms(labels, 5, beta, seed, min_users=1), 5) for seed in range(5)]
        )
    assert skews[0.1] > skews[1.0] > skews[100.0]
    assert skews[100.0] < 0.1 < skews[0.1]


def test_dirichlet_refuses_what_cannot_be_done() -> None:
    with pytest.raises(ValueError, match="beta"):
        dirichlet_user_platforms(np.zeros(10, dtype=np.int64), 2, 0.0, 0)
    with pytest.raises(ValueError, match="cannot give"):
        dirichlet_user_platforms(np.zeros(10, dtype=np.int64), 5, 1.0, 0, min_users=3)


def test_users_below_five_ratings_are_dropped_and_levels_found() -> None:
    x = synthetic(n_users=60, n_items=50, seed=1, min_interactions=2, mean_interactions=6.0, max_interactions=30)
    counts = np.bincount(x.user, minlength=x.n_users)
    s = make_platform_split(x, n_platforms=3, beta=1.0, seed=0)
    assert s.n_users == int((counts >= 5).sum()) < x.n_users
    assert np.array_equal(level_index(np.array([1.0, 2.0, 3.0]), np.array([1.0, 1.4, 2.6, 3.0])), [0, 0, 2, 2])
    assert list(s.levels) == sorted(set(np.concatenate([s.train.rating, s.val.rating, s.test.rating]).tolist()))
