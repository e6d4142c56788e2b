"""GroupLens MovieLens folders:
- ml-100k: `u.data` (tab), `u.user` and `u.item` (`|`), latin-1.
- ml-1m: `ratings.dat`, `users.dat`, `movies.dat` (`::`, latin-1).
- "latest" (ml-latest-small): `ratings.csv` (userId,movieId,rating,timestamp) and
  optional `movies.csv` (movieId,title,genres; CSV quoting, UTF-8).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from models.data import features as F
from models.data.assemble import Side, assemble
from models.data.errors import DataFormatError
from models.data.tables import Table, check_ids, parse_numbers, read_csv_rows, read_table, year_of
from models.data.types import Interactions

Feature = tuple[np.ndarray, tuple[str, ...]]  # an encoded column block and its feature names


def _rating_columns(tab: Table, item_what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(users, items, ratings, timestamps) of a ratings table laid out user, item, rating,
    timestamp (integer seconds)."""
    users = check_ids(tab, tab.col(0), "user id")
    items = check_ids(tab, tab.col(1), item_what)
    rating = parse_numbers(tab, tab.col(2), "rating", np.float32)
    ts = parse_numbers(tab, tab.col(3), "timestamp", np.int64)
    return users, items, rating, ts


def _latin1_table(path: Path, sep: str, ncols: int) -> Table:
    """A headerless latin-1 GroupLens file (`u.*`, `*.dat`) of `ncols` columns."""
    _, tab = read_table(path, sep, encoding="latin-1", ncols=ncols)
    return tab


def _feature_side(tab: Table, id_what: str, parts: list[Feature], titles: Sequence[str] | None = None) -> Side:
    """A side table whose ids are its first column, with the features `parts` (one row per row)."""
    feats, fnames = F.concat(parts, len(tab))
    return Side(
        tab.path, check_ids(tab, tab.col(0), id_what), tab.lines, feats, fnames,
        titles=None if titles is None else np.asarray(titles, dtype=object),
    )  # fmt: skip


def _movies_parts(titles: list[str], genres: list[list[str]]) -> list[Feature]:
    """A movie list's features: the genre multi-hot and the release year from the title."""
    return [F.multihot(genres, "genre"), F.zscore_with_missing(year_of(titles), "release_year")]


def load_movielens_100k(folder: str | os.PathLike[str], name: str = "ml-100k") -> Interactions:
    """GroupLens `ml-100k/`: u.data (tab), u.user and u.item (`|`, latin-1)."""
    d = Path(folder)
    tab = _latin1_table(d / "u.data", "\t", 4)
    users, items, rating, ts = _rating_columns(tab, "item id")

    user_side = None
    if (d / "u.user").is_file():
        ut = _latin1_table(d / "u.user", "|", 5)
        parts = [
            F.age_bucket_onehot(parse_numbers(ut, ut.col(1), "age", np.int64)),
            F.onehot(ut.col(2), "gender"),
            F.onehot(ut.col(3), "occupation"),
        ]
        user_side = _feature_side(ut, "user id", parts)

    item_side = None
    if (d / "u.item").is_file():
        n_genres = len(F.GROUPLENS_GENRES)
        it = _latin1_table(d / "u.item", "|", 5 + n_genres)
        flags = np.zeros((len(it), n_genres), dtype=np.float32)
        for g in range(n_genres):
            col = it.col(5 + g)
            v = parse_numbers(it, col, f"genre flag {F.GROUPLENS_GENRES[g]!r}", np.int64)
            bad = np.flatnonzero((v != 0) & (v != 1))
            if bad.size:
                raise DataFormatError(it.path, int(it.lines[bad[0]]), f"genre flag {col[bad[0]]!r} is not 0 or 1")
            flags[:, g] = v
        present = np.asarray(flags.any(axis=0), dtype=bool)
        genre_part = (flags[:, present], tuple(f"genre:{g}" for g, p in zip(F.GROUPLENS_GENRES, present) if p))
        parts = [genre_part, F.zscore_with_missing(year_of(it.col(2)), "release_year")]
        item_side = _feature_side(it, "item id", parts, titles=it.col(1))
    return assemble(name, tab, users, items, rating, ts, user_side, item_side)


def load_movielens_1m(folder: str | os.PathLike[str], name: str = "ml-1m") -> Interactions:
    """GroupLens `ml-1m/`: ratings.dat, users.dat, movies.dat (`::`, latin-1)."""
    d = Path(folder)
    tab = _latin1_table(d / "ratings.dat", "::", 4)
    users, items, rating, ts = _rating_columns(tab, "item id")

    user_side = None
    if (d / "users.dat").is_file():
        ut = _latin1_table(d / "users.dat", "::", 5)
        occ = parse_numbers(ut, ut.col(3), "occupation code", np.int64)
        bad = np.flatnonzero((occ < 0) | (occ >= len(F.ML1M_OCCUPATIONS)))
        if bad.size:
            raise DataFormatError(ut.path, int(ut.lines[bad[0]]), f"occupation code {int(occ[bad[0]])} is not in 0..20")
        parts = [
            F.age_bucket_onehot(parse_numbers(ut, ut.col(2), "age", np.int64)),
            F.onehot(ut.col(1), "gender"),
            F.onehot([F.ML1M_OCCUPATIONS[o] for o in occ.tolist()], "occupation", sorted(F.ML1M_OCCUPATIONS)),
        ]
        user_side = _feature_side(ut, "user id", parts)

    item_side = None
    if (d / "movies.dat").is_file():
        mt = _latin1_table(d / "movies.dat", "::", 3)
        titles = mt.col(1)
        genres = [[g for g in c.split("|") if g] for c in mt.col(2)]
        item_side = _feature_side(mt, "item id", _movies_parts(titles, genres), titles=titles)
    return assemble(name, tab, users, items, rating, ts, user_side, item_side)


def load_movielens_latest(folder: str | os.PathLike[str], name: str = "ml-latest-small") -> Interactions:
    """GroupLens "latest" layout (ml-latest-small): ratings.csv + optional movies.csv.

    Ratings are explicit (0.5..5 in half stars), timestamps in seconds. movies.csv
    gives titles, a genre multi-hot ("(no genres listed)" is no genre) and the
    release year from the title; it lists movies nobody rated, which are dropped.
    """
    d = Path(folder)
    tab = read_csv_rows(d / "ratings.csv", ["userId", "movieId", "rating", "timestamp"])
    users, items, rating, ts = _rating_columns(tab, "movie id")
    item_side = None
    if (d / "movies.csv").is_file():
        mt = read_csv_rows(d / "movies.csv", ["movieId", "title", "genres"])
        titles = [t.strip() for t in mt.col(1)]
        genres = [[g for g in c.split("|") if g and g != "(no genres listed)"] for c in mt.col(2)]
        item_side = _feature_side(mt, "movie id", _movies_parts(titles, genres), titles=titles)
    return assemble(name, tab, users, items, rating, ts, None, item_side)
