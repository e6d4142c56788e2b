"""Train / validation / test splits (contracts: models/data/types.py).

Decisions (docs/decisions.md):
- Leave-one-out order: interactions are ordered by timestamp; ties are broken by
  the position in the `Interactions` arrays (the loaders keep source-file order
  within a timestamp), so the held-out items do not depend on the seed; the seed
  only drives the sampled negatives and the placebo.
- A repeated (user, item) pair counts once (its latest occurrence).
- Users that cannot be evaluated keep *all* their interactions in training and
  get -1 in `val_item`, `test_item`, `placebo_item` and their negative rows:
  users with fewer than 3 interactions, and users with fewer than 100 items they
  never touched (99 negatives + the placebo would not fit). `evaluable_users`
  lists the others; the evaluation skips -1 rows. ML-100K has >= 20 ratings per
  user, so every user is evaluated there.
- Negatives: for each evaluated user, 99 distinct items drawn uniformly from the
  items the user never touched (train, validation or test), independently for
  validation and test (separate random streams); the placebo is drawn uniformly
  from the never-touched items outside the test negatives.
"""

from __future__ import annotations

import numpy as np

from models.data.types import N_EVAL_NEGATIVES, ExplicitSplit, ImplicitSplit, Interactions

_CHUNK_CELLS = 1 << 22  # rows x n_items processed at once when drawing negatives
MIN_INTERACTIONS_FOR_EVAL = 3


def dedupe_latest(x: Interactions) -> np.ndarray:
    """Row indices keeping one row per (user, item): the latest by (timestamp, position),
    returned ordered by (user, timestamp, position)."""
    n = len(x.user)
    pos = np.arange(n)
    srt = np.lexsort((pos, x.timestamp, x.item, x.user))
    last = np.ones(n, dtype=bool)
    if n > 1:
        u, i = x.user[srt], x.item[srt]
        last[:-1] = (u[1:] != u[:-1]) | (i[1:] != i[:-1])
    keep = srt[last]
    return keep[np.lexsort((pos[keep], x.timestamp[keep], x.user[keep]))]


def _touched_mask(
    indptr: np.ndarray, items: np.ndarray, rows: np.ndarray, n_items: int
) -> np.ndarray:
    """Boolean (len(rows), n_items): item in the CSR row of each user in `rows`."""
    starts, ends = indptr[rows], indptr[rows + 1]
    lens = ends - starts
    mask = np.zeros((len(rows), n_items), dtype=bool)
    if lens.sum():
        r = np.repeat(np.arange(len(rows)), lens)
        offs = np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens)
        mask[r, items[np.repeat(starts, lens) + offs]] = True
    return mask


def _draw_without(
    rng: np.random.Generator, forbidden: np.ndarray, k: int
) -> np.ndarray:
    """k distinct items per row, uniform over the allowed ones (random-key top-k).
    Each row must allow at least k items. Rows come back sorted."""
    keys = rng.random(forbidden.shape, dtype=np.float64)
    keys[forbidden] = np.inf
    if k == 1:
        return keys.argmin(axis=1)[:, None]
    part = np.argpartition(keys, k - 1, axis=1)[:, :k]
    return np.sort(part, axis=1)


def leave_one_out(
    interactions: Interactions, seed: int, *, n_negatives: int = N_EVAL_NEGATIVES
) -> ImplicitSplit:
    """Leave-one-out by timestamp (see the module docstring for ties and short users)."""
    x = interactions
    n_users, n_items = x.n_users, x.n_items
    order = dedupe_latest(x)
    users, items = x.user[order], x.item[order]
    counts = np.bincount(users, minlength=n_users).astype(np.int64)
    indptr_all = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr_all[1:])

    evaluable = (counts >= MIN_INTERACTIONS_FOR_EVAL) & (n_items - counts >= n_negatives + 1)
    last = indptr_all[1:] - 1  # index of each user's last interaction (if any)
    test_item = np.full(n_users, -1, dtype=np.int64)
    val_item = np.full(n_users, -1, dtype=np.int64)
    test_item[evaluable] = items[last[evaluable]]
    val_item[evaluable] = items[last[evaluable] - 1]

    held_out = np.zeros(len(items), dtype=bool)
    held_out[last[evaluable]] = True
    held_out[last[evaluable] - 1] = True
    train_items = items[~held_out]
    train_counts = counts - 2 * evaluable
    train_indptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(train_counts, out=train_indptr[1:])

    ss = np.random.SeedSequence(seed)
    val_rng, test_rng, placebo_rng = (np.random.default_rng(s) for s in ss.spawn(3))
    val_neg = np.full((n_users, n_negatives), -1, dtype=np.int64)
    test_neg = np.full((n_users, n_negatives), -1, dtype=np.int64)
    placebo = np.full(n_users, -1, dtype=np.int64)
    ev = np.flatnonzero(evaluable)
    chunk = max(1, _CHUNK_CELLS // max(n_items, 1))
    for s in range(0, len(ev), chunk):
        rows = ev[s : s + chunk]
        touched = _touched_mask(indptr_all, items, rows, n_items)
        val_neg[rows] = _draw_without(val_rng, touched, n_negatives)
        tn = _draw_without(test_rng, touched, n_negatives)
        test_neg[rows] = tn
        touched[np.arange(len(rows))[:, None], tn] = True
        placebo[rows] = _draw_without(placebo_rng, touched, 1)[:, 0]

    return ImplicitSplit(
        n_users=n_users,
        n_items=n_items,
        train_indptr=train_indptr,
        train_items=train_items.astype(np.int64),
        val_item=val_item,
        test_item=test_item,
        val_negatives=val_neg,
        test_negatives=test_neg,
        placebo_item=placebo,
        seed=seed,
        user_features=x.user_features,
        item_features=x.item_features,
    )


def evaluable_users(split: ImplicitSplit) -> np.ndarray:
    """Users with a held-out test item (the others are training-only)."""
    return np.flatnonzero(split.test_item >= 0)


def _round_half_up(v: np.ndarray) -> np.ndarray:
    return np.floor(v + 0.5).astype(np.int64)


def random_explicit_split(
    interactions: Interactions,
    seed: int,
    *,
    test_fraction: float = 0.2,
    val_fraction: float = 0.1,
) -> ExplicitSplit:
    """Per-user random split: round(20%) of each user's ratings to test, then round(10%)
    of the rest to validation, always leaving at least one training rating.

    A repeated (user, item) pair counts once (latest rating). `rating_range` is the
    observed (min, max) rating. Each part is ordered by user, then source position.
    """
    x = interactions
    rows = dedupe_latest(x)
    rows = rows[np.argsort(x.user[rows], kind="stable")]
    users = x.user[rows]
    counts = np.bincount(users, minlength=x.n_users)
    n_test = np.minimum(_round_half_up(test_fraction * counts), np.maximum(counts - 1, 0))
    rest = counts - n_test
    n_val = np.minimum(_round_half_up(val_fraction * rest), np.maximum(rest - 1, 0))

    rng = np.random.default_rng(np.random.SeedSequence(seed))
    keys = rng.random(len(rows))
    perm = np.lexsort((keys, users))  # random order within each user
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.empty(len(rows), dtype=np.int64)
    rank[perm] = np.arange(len(rows)) - starts[users[perm]]
    is_test = rank < n_test[users]
    is_val = ~is_test & (rank < (n_test + n_val)[users])
    is_train = ~is_test & ~is_val

    def part(m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        r = rows[m]
        return x.user[r].astype(np.int64), x.item[r].astype(np.int64), x.rating[r].astype(np.float32)

    tr, va, te = part(is_train), part(is_val), part(is_test)
    lo = float(x.rating.min()) if len(x.rating) else 1.0
    hi = float(x.rating.max()) if len(x.rating) else 5.0
    return ExplicitSplit(
        n_users=x.n_users,
        n_items=x.n_items,
        train_user=tr[0],
        train_item=tr[1],
        train_rating=tr[2],
        val_user=va[0],
        val_item=va[1],
        val_rating=va[2],
        test_user=te[0],
        test_item=te[1],
        test_rating=te[2],
        seed=seed,
        user_features=x.user_features,
        item_features=x.item_features,
        rating_range=(lo, hi),
    )
