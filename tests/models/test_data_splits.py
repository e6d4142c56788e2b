"""Split contracts (models/data/types.py) and the synthetic generator."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.data.loaders import load_dataset
from models.data.splits import evaluable_users, leave_one_out, random_explicit_split
from models.data.synthetic import synthetic
from models.data.types import N_EVAL_NEGATIVES, ImplicitSplit, Interactions



@pytest.fixture(scope="module")
def data() -> Interactions:
    return synthetic(300, 400, seed=3)


@pytest.fixture(scope="module")
def split(data: Interactions) -> ImplicitSplit:
    return leave_one_out(data, seed=11)


def touched_sets(x: Interactions) -> list[set[int]]:
    out: list[set[int]] = [set() for _ in range(x.n_users)]
    for u, i in zip(x.user.tolist(), x.item.tolist()):
        out[u].add(i)
    return out


def train_sets(s: ImplicitSplit) -> list[set[int]]:
    return [set(s.train_items[s.train_indptr[u] : s.train_indptr[u + 1]].tolist()) for u in range(s.n_users)]


# ------------------------------------------------------------------ leave-one-out


def test_shapes_and_dtypes(split: ImplicitSplit, data: Interactions) -> None:
    s = split
    assert (s.n_users, s.n_items) == (data.n_users, data.n_items)
    assert s.train_indptr.shape == (s.n_users + 1,) and s.train_indptr[0] == 0
    assert s.train_indptr[-1] == len(s.train_items) == len(data.user) - 2 * s.n_users
    for a in (s.train_indptr, s.train_items, s.val_item, s.test_item, s.val_negatives, s.test_negatives, s.placebo_item):
        assert a.dtype == np.int64
    assert s.val_negatives.shape == s.test_negatives.shape == (s.n_users, N_EVAL_NEGATIVES)
    assert s.user_features is data.user_features and s.item_features is data.item_features
    assert s.seed == 11


def test_held_out_are_the_last_two_by_time(split: ImplicitSplit, data: Interactions) -> None:
    for u in range(data.n_users):
        rows = np.flatnonzero(data.user == u)
        order = rows[np.lexsort((rows, data.timestamp[rows]))]  # ties: array position
        assert split.test_item[u] == data.item[order[-1]]
        assert split.val_item[u] == data.item[order[-2]]
        train = split.train_items[split.train_indptr[u] : split.train_indptr[u + 1]]
        assert train.tolist() == data.item[order[:-2]].tolist()  # in time order, oldest first


def test_held_out_not_in_train_and_negatives_never_touched(split: ImplicitSplit, data: Interactions) -> None:
    touched = touched_sets(data)
    train = train_sets(split)
    for u in range(split.n_users):
        assert split.test_item[u] not in train[u] and split.val_item[u] not in train[u]
        assert split.test_item[u] != split.val_item[u]
        for negs in (split.val_negatives[u], split.test_negatives[u]):
            assert len(set(negs.tolist())) == N_EVAL_NEGATIVES  # distinct
            assert not (set(negs.tolist()) & touched[u])
            assert negs.min() >= 0 and negs.max() < split.n_items
        p = int(split.placebo_item[u])
        assert 0 <= p < split.n_items
        assert p not in touched[u] and p not in set(split.test_negatives[u].tolist())


def test_val_and_test_negatives_are_independent(split: ImplicitSplit, data: Interactions) -> None:
    touched = touched_sets(data)
    overlaps, expected = [], []
    for u in range(split.n_users):
        free = split.n_items - len(touched[u])
        overlaps.append(len(set(split.val_negatives[u].tolist()) & set(split.test_negatives[u].tolist())))
        expected.append(N_EVAL_NEGATIVES**2 / free)  # hypergeometric mean
    assert not all(o == N_EVAL_NEGATIVES for o in overlaps)
    assert np.mean(overlaps) == pytest.approx(np.mean(expected), rel=0.1)


def test_negatives_are_uniform_over_untouched_items() -> None:
    # one user who touched items 0..9 of 120: every other item should be drawn ~99/110 of the time
    n_items = 120
    x = Interactions(
        name="u",
        user=np.zeros(10, np.int64),
        item=np.arange(10, dtype=np.int64),
        rating=np.ones(10, np.float32),
        timestamp=np.arange(10, dtype=np.int64),
        n_users=1,
        n_items=n_items,
        raw_user_ids=np.arange(1),
        raw_item_ids=np.arange(n_items),
    )
    counts = np.zeros(n_items)
    placebo = np.zeros(n_items)
    for seed in range(200):
        s = leave_one_out(x, seed)
        counts[s.test_negatives[0]] += 1
        placebo[s.placebo_item[0]] += 1
    assert counts[:10].sum() == 0 and placebo[:10].sum() == 0
    assert counts[10:].min() > 0.7 * 200 * 99 / 110
    assert placebo[10:].sum() == 200 and placebo[10:].max() < 30  # 11 free items, ~18 each


def test_deterministic_by_seed(data: Interactions, split: ImplicitSplit) -> None:
    again = leave_one_out(data, seed=11)
    other = leave_one_out(data, seed=12)
    for f in ("train_indptr", "train_items", "val_item", "test_item", "val_negatives", "test_negatives", "placebo_item"):
        assert np.array_equal(getattr(split, f), getattr(again, f)), f
    # the held-out items do not depend on the seed; the negatives do
    assert np.array_equal(split.test_item, other.test_item)
    assert not np.array_equal(split.test_negatives, other.test_negatives)
    assert not np.array_equal(split.val_negatives, other.val_negatives)


def tiny(user: list[int], item: list[int], ts: list[int], n_users: int, n_items: int) -> Interactions:
    return Interactions(
        name="tiny",
        user=np.array(user, np.int64),
        item=np.array(item, np.int64),
        rating=np.ones(len(user), np.float32),
        timestamp=np.array(ts, np.int64),
        n_users=n_users,
        n_items=n_items,
        raw_user_ids=np.arange(n_users),
        raw_item_ids=np.arange(n_items),
    )


def test_short_users_are_training_only() -> None:
    # user 0: 4 interactions; user 1: 2; user 2: none; user 3 touched all but 99 items
    n_items = 150
    u = [0] * 4 + [1] * 2 + [3] * 51
    i = [5, 6, 7, 8] + [1, 2] + list(range(51))
    x = tiny(u, i, list(range(len(u))), 4, n_items)
    s = leave_one_out(x, 0)
    assert evaluable_users(s).tolist() == [0]
    for w in (1, 2, 3):
        assert s.val_item[w] == s.test_item[w] == s.placebo_item[w] == -1
        assert np.all(s.val_negatives[w] == -1) and np.all(s.test_negatives[w] == -1)
    assert train_sets(s)[1] == {1, 2} and len(train_sets(s)[3]) == 51 and train_sets(s)[2] == set()
    assert (s.val_item[0], s.test_item[0]) == (7, 8)


def test_timestamp_ties_follow_array_order_and_duplicates_count_once() -> None:
    # items 3, 1, 2 share the last timestamp: the later array position is "later"
    x = tiny([0, 0, 0, 0, 0], [9, 3, 1, 2, 9], [5, 10, 10, 10, 1], 1, 200)
    s = leave_one_out(x, 0)
    assert (s.val_item[0], s.test_item[0]) == (1, 2)
    assert train_sets(s)[0] == {9, 3}  # the (0, 9) pair appears twice: once in train
    assert 9 not in set(s.test_negatives[0].tolist())


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n_users=st.integers(1, 30), extra=st.integers(0, 60))
def test_contracts_hold_on_random_datasets(seed: int, n_users: int, extra: int) -> None:
    x = synthetic(n_users, 110 + extra, seed=seed, min_interactions=1, mean_interactions=6)
    s = leave_one_out(x, seed)
    touched = touched_sets(x)
    train = train_sets(s)
    for u in range(n_users):
        if s.test_item[u] < 0:
            assert len(touched[u]) < 3 or x.n_items - len(touched[u]) < 100
            assert train[u] == touched[u]
            continue
        assert train[u] | {int(s.val_item[u]), int(s.test_item[u])} == touched[u]
        assert not ({int(s.val_item[u]), int(s.test_item[u])} & train[u])
        for negs in (s.val_negatives[u], s.test_negatives[u]):
            assert len(set(negs.tolist())) == 99 and not (set(negs.tolist()) & touched[u])
        assert s.placebo_item[u] not in touched[u] | set(s.test_negatives[u].tolist())


# ------------------------------------------------------------------ explicit


def test_random_explicit_split(data: Interactions) -> None:
    e = random_explicit_split(data, seed=5)
    n = len(data.user)
    assert len(e.train_user) + len(e.val_user) + len(e.test_user) == n
    key = lambda us, it: set((us * data.n_items + it).tolist())  # noqa: E731
    tr, va, te = key(e.train_user, e.train_item), key(e.val_user, e.val_item), key(e.test_user, e.test_item)
    assert not (tr & va) and not (tr & te) and not (va & te)
    assert tr | va | te == key(data.user, data.item)
    assert len(te) / n == pytest.approx(0.2, abs=0.02)
    assert len(va) / (n - len(te)) == pytest.approx(0.1, abs=0.02)
    assert np.all(np.bincount(e.train_user, minlength=data.n_users) >= 1)
    # ratings travel with their pair
    lookup = {(u, i): r for u, i, r in zip(data.user.tolist(), data.item.tolist(), data.rating.tolist())}
    for u, i, r in zip(e.test_user.tolist(), e.test_item.tolist(), e.test_rating.tolist()):
        assert lookup[(u, i)] == r
    assert e.rating_range == (1.0, 5.0) and e.train_rating.dtype == np.float32
    assert e.user_features is data.user_features
    again, other = random_explicit_split(data, seed=5), random_explicit_split(data, seed=6)
    assert np.array_equal(e.test_item, again.test_item) and np.array_equal(e.val_user, again.val_user)
    assert not np.array_equal(e.test_item, other.test_item)


def test_explicit_split_small_users() -> None:
    x = tiny([0, 1, 1, 2, 2, 2, 2, 2], [0, 0, 1, 0, 1, 2, 3, 4], list(range(8)), 3, 5)
    e = random_explicit_split(x, 0)
    assert np.bincount(e.train_user, minlength=3).tolist() == [1, 2, 4]  # 5 ratings: 1 test, 0 val
    assert e.test_user.tolist() == [2] and len(e.val_user) == 0


# ------------------------------------------------------------------ synthetic


def test_synthetic_is_seeded_fast_and_structured() -> None:
    x = synthetic()
    y = synthetic()
    assert np.array_equal(x.user, y.user) and np.array_equal(x.item, y.item) and np.array_equal(x.rating, y.rating)
    assert not np.array_equal(synthetic(seed=1).item, x.item)
    assert (x.n_users, x.n_items) == (200, 300)
    counts = np.bincount(x.user, minlength=x.n_users)
    assert counts.min() >= 10 and x.n_items - counts.max() >= 100
    assert set(np.unique(x.rating).tolist()) == {1.0, 2.0, 3.0, 4.0, 5.0}
    pop = np.sort(np.bincount(x.item, minlength=x.n_items))[::-1]
    assert pop[:30].sum() > 3 * pop[-30:].sum()  # popularity skew
    assert len(np.unique(x.user * x.n_items + x.item)) == len(x.user)
    same_user = x.user[1:] == x.user[:-1]
    assert np.all(np.diff(x.timestamp)[same_user] >= 0) and np.any(np.diff(x.timestamp)[same_user] == 0)
    assert x.user_features is not None and x.item_features is not None
    assert x.user_features.shape[0] == 200 and x.item_features.shape[0] == 300
    assert x.user_features[:, :7].sum(axis=1).tolist() == [1.0] * 200  # age one-hot
    assert x.item_features[:, :10].sum(axis=1).min() >= 1  # every item has a genre


def test_synthetic_features_carry_signal() -> None:
    # a per-genre mean rating should predict held-out ratings better than the global mean
    x = synthetic(400, 300, seed=2)
    e = random_explicit_split(x, 0)
    assert x.item_features is not None
    g = x.item_features[:, :10]
    mu = e.train_rating.mean()
    # per-user linear model on item genres (ridge), like FedMMF's one-order mask
    err_mask, err_mean = [], []
    for u in range(x.n_users):
        tr, te = e.train_user == u, e.test_user == u
        if te.sum() == 0:
            continue
        A = g[e.train_item[tr]]
        w = np.linalg.solve(A.T @ A + 1.0 * np.eye(10), A.T @ (e.train_rating[tr] - mu))
        err_mask.append(((mu + g[e.test_item[te]] @ w - e.test_rating[te]) ** 2).sum())
        err_mean.append(((mu - e.test_rating[te]) ** 2).sum())
    assert sum(err_mask) < 0.95 * sum(err_mean)


# ------------------------------------------------------------------ the real ML-100K

def test_real_ml100k_splits_are_complete(ml100k_data_dir: Path) -> None:
    x = load_dataset("ml-100k", ml100k_data_dir)
    s = leave_one_out(x, 0)
    e = random_explicit_split(x, 0)
    assert len(evaluable_users(s)) == 943
    assert s.train_indptr[-1] == 100_000 - 2 * 943
    assert len(e.train_user) + len(e.val_user) + len(e.test_user) == 100_000
