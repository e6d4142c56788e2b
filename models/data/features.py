"""Side-feature encoding shared by every loader (FedMMF's private mask models use it).

Encoding (recorded in docs/decisions.md):
- user age -> one-hot over the 7 MovieLens-1M buckets (<18, 18-24, 25-34, 35-44,
  45-49, 50-55, 56+); ML-1M ages are already those bucket codes, ML-100K ages are
  bucketed the same way, so both datasets share the columns.
- gender -> one-hot (`gender:F`, `gender:M`).
- occupation -> one-hot over the dataset's occupation names (sorted).
- item genres -> multi-hot over the GroupLens genre list (in GroupLens order,
  only genres that occur), followed by any other genre tokens, sorted.
- release year -> z-scored over the items whose year is known; unknown years get
  0 (the mean) and a `release_year_missing` flag of 1.
- zip codes, titles, URLs -> not features (titles are kept in `item_titles`).
All matrices are float32.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

AGE_BUCKETS: tuple[tuple[int, str], ...] = (
    (18, "age:<18"),
    (25, "age:18-24"),
    (35, "age:25-34"),
    (45, "age:35-44"),
    (50, "age:45-49"),
    (56, "age:50-55"),
    (10**9, "age:56+"),
)
AGE_FEATURE_NAMES: tuple[str, ...] = tuple(name for _, name in AGE_BUCKETS)

# The genre flags of GroupLens ml-100k `u.item`, in file order.
GROUPLENS_GENRES: tuple[str, ...] = (
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
    "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery",
    "Romance", "Sci-Fi", "Thriller", "War", "Western",
)  # fmt: skip

# ML-1M `users.dat` occupation codes (from the dataset's README).
ML1M_OCCUPATIONS: tuple[str, ...] = (
    "other", "academic/educator", "artist", "clerical/admin", "college/grad student",
    "customer service", "doctor/health care", "executive/managerial", "farmer",
    "homemaker", "K-12 student", "lawyer", "programmer", "retired", "sales/marketing",
    "scientist", "self-employed", "technician/engineer", "tradesman/craftsman",
    "unemployed", "writer",
)  # fmt: skip


def age_bucket_onehot(ages: np.ndarray) -> tuple[np.ndarray, tuple[str, ...]]:
    ages = np.asarray(ages, dtype=np.int64)
    bounds = np.array([b for b, _ in AGE_BUCKETS[:-1]], dtype=np.int64)
    idx = np.searchsorted(bounds, ages, side="right")
    out = np.zeros((len(ages), len(AGE_BUCKETS)), dtype=np.float32)
    out[np.arange(len(ages)), idx] = 1.0
    return out, AGE_FEATURE_NAMES


def onehot(
    values: Sequence[str], prefix: str, vocab: Sequence[str] | None = None
) -> tuple[np.ndarray, tuple[str, ...]]:
    """One-hot of string categories; `vocab` defaults to the sorted distinct values.
    Values outside `vocab` give an all-zero row."""
    vals = np.asarray(values, dtype=str)
    voc = sorted(set(vals.tolist())) if vocab is None else list(vocab)
    lookup = {v: i for i, v in enumerate(voc)}
    out = np.zeros((len(vals), len(voc)), dtype=np.float32)
    for r, v in enumerate(vals.tolist()):
        j = lookup.get(v)
        if j is not None:
            out[r, j] = 1.0
    return out, tuple(f"{prefix}:{v}" for v in voc)


def genre_vocab(genre_lists: Iterable[Sequence[str]]) -> list[str]:
    present = {g for gl in genre_lists for g in gl}
    known = [g for g in GROUPLENS_GENRES if g in present]
    return known + sorted(present - set(GROUPLENS_GENRES))


def multihot(
    lists: Sequence[Sequence[str]], prefix: str, vocab: Sequence[str] | None = None
) -> tuple[np.ndarray, tuple[str, ...]]:
    voc = genre_vocab(lists) if vocab is None else list(vocab)
    lookup = {v: i for i, v in enumerate(voc)}
    out = np.zeros((len(lists), len(voc)), dtype=np.float32)
    for r, gl in enumerate(lists):
        for g in gl:
            j = lookup.get(g)
            if j is not None:
                out[r, j] = 1.0
    return out, tuple(f"{prefix}:{v}" for v in voc)


def zscore_with_missing(
    values: np.ndarray, name: str
) -> tuple[np.ndarray, tuple[str, ...]]:
    """(N, 2): z-scored value (NaN -> 0) and a missing flag."""
    v = np.asarray(values, dtype=np.float64)
    missing = np.isnan(v)
    known = v[~missing]
    mean = known.mean() if known.size else 0.0
    std = known.std() if known.size else 1.0
    std = std if std > 0 else 1.0
    z = np.where(missing, 0.0, (v - mean) / std)
    out = np.stack([z, missing.astype(np.float64)], axis=1).astype(np.float32)
    return out, (name, f"{name}_missing")


def concat(
    parts: Sequence[tuple[np.ndarray, tuple[str, ...]]], n_rows: int
) -> tuple[np.ndarray | None, tuple[str, ...]]:
    parts = [p for p in parts if p[0].shape[1] > 0]
    if not parts:
        return None, ()
    mat = np.concatenate([p[0] for p in parts], axis=1).astype(np.float32)
    assert mat.shape[0] == n_rows
    names = tuple(n for p in parts for n in p[1])
    return mat, names
