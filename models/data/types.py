"""Shared data contracts for loaders, splits, models and evaluation.

Ids are dense: users 0..n_users-1, items 0..n_items-1. Arrays are numpy; the
engine moves them to torch. All splits are deterministic given their seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

N_EVAL_NEGATIVES = 99  # the NCF protocol used by the papers


@dataclass(frozen=True)
class Interactions:
    """A loaded dataset after id remapping.

    `rating` is the explicit rating where the source has one, else 1.0.
    `user_features` / `item_features` are float32 design matrices (one-hot
    categories, scaled numbers) or None when the source has no side data.
    `*_ids` map dense ids back to the source's raw ids.
    """

    name: str
    user: np.ndarray  # int64 (N,)
    item: np.ndarray  # int64 (N,)
    rating: np.ndarray  # float32 (N,)
    timestamp: np.ndarray  # int64 (N,)
    n_users: int
    n_items: int
    raw_user_ids: np.ndarray  # (n_users,) source ids, as strings or ints
    raw_item_ids: np.ndarray  # (n_items,)
    user_features: np.ndarray | None = None  # float32 (n_users, F_u)
    item_features: np.ndarray | None = None  # float32 (n_items, F_i)
    user_feature_names: tuple[str, ...] = ()
    item_feature_names: tuple[str, ...] = ()
    item_titles: np.ndarray | None = None  # (n_items,) str, for readable top-k


@dataclass(frozen=True)
class ImplicitSplit:
    """Leave-one-out by timestamp: last interaction = test, second-to-last = validation.

    Contracts (tested in tests/models):
    - `train_*` is a CSR matrix over users: user u's training items are
      train_items[train_indptr[u]:train_indptr[u+1]], oldest first (the
      leave-one-out order); val/test items are not in it.
    - `val_negatives[u]` and `test_negatives[u]` are 99 distinct items user u never
      interacted with at all (train, val or test), drawn independently per split.
    - `placebo_item[u]` is an item user u never interacted with and that is not in
      test_negatives[u]; it is ranked against test_negatives[u] exactly like the
      test item, so its HR@10 must sit near 10/100.
    - Training negatives are NOT stored: they are drawn each round from all items
      minus the user's *training* items (so held-out items can be drawn, as they
      would be on a real device that does not know its future).
    """

    n_users: int
    n_items: int
    train_indptr: np.ndarray  # int64 (n_users + 1,)
    train_items: np.ndarray  # int64 (nnz,)
    val_item: np.ndarray  # int64 (n_users,)
    test_item: np.ndarray  # int64 (n_users,)
    val_negatives: np.ndarray  # int64 (n_users, 99)
    test_negatives: np.ndarray  # int64 (n_users, 99)
    placebo_item: np.ndarray  # int64 (n_users,)
    seed: int
    user_features: np.ndarray | None = None
    item_features: np.ndarray | None = None


@dataclass(frozen=True)
class ExplicitSplit:
    """Random per-user split of ratings, seeded: 80% train+validation / 20% test,
    and validation = a further random 10% of each user's train+validation part.

    Every user keeps at least one training rating. Features pass through for
    FedMMF's private mask models.
    """

    n_users: int
    n_items: int
    train_user: np.ndarray  # int64
    train_item: np.ndarray  # int64
    train_rating: np.ndarray  # float32
    val_user: np.ndarray
    val_item: np.ndarray
    val_rating: np.ndarray
    test_user: np.ndarray
    test_item: np.ndarray
    test_rating: np.ndarray
    seed: int
    user_features: np.ndarray | None = None
    item_features: np.ndarray | None = None
    rating_range: tuple[float, float] = field(default=(1.0, 5.0))
