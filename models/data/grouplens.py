"""GroupLens MovieLens folders:
- ml-100k: `u.data` (tab), `u.user` and `u.item` (`|`), latin-1.
- ml-1m: `ratings.dat`, `users.dat`, `movies.dat` (`::`, latin-1).
- "latest" (ml-latest-small): `ratings.csv` (userId,movieId,rating,timestamp) and
  optional `movies.csv` (movieId,title,genres; CSV quoting, UTF-8).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
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


#: A side file of a latin-1 layout: its name, separator, column count, and
#: the function that turns its table into the side's features.
SideFile = tuple[str, str, int, Callable[[Table], Side]]


def _load_latin1(folder: str | os.PathLike[str], name: str, ratings: tuple[str, str], users: SideFile,
                 items: SideFile) -> Interactions:
    """A latin-1 GroupLens folder: the ratings file (user, item, rating,
    timestamp) and the optional user and item side files."""
    d = Path(folder)
    tab = _latin1_table(d / ratings[0], ratings[1], 4)
    users_, items_, rating, ts = _rating_columns(tab, "item id")
    sides = []
    for file, sep, ncols, build in (users, items):
        sides.append(build(_latin1_table(d / file, sep, ncols)) if (d / file).is_file() else None)
    return assemble(name, tab, users_, items_, rating, ts, sides[0], sides[1])


def _ml100k_users(ut: Table) -> Side:
    """u.user: id | age | gender | occupation | zip."""
    parts = [
        F.age_bucket_onehot(parse_numbers(ut, ut.col(1), "age", np.int64)),
        F.onehot(ut.col(2), "gender"),
        F.onehot(ut.col(3), "occupation"),
    ]
    return _feature_side(ut, "user id", parts)


def _ml100k_items(it: Table) -> Side:
    """u.item: id | title | release date | video date | url | 19 genre flags."""
    n_genres = len(F.GROUPLENS_GENRES)
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
    return _feature_side(it, "item id", parts, titles=it.col(1))


def _ml1m_users(ut: Table) -> Side:
    """users.dat: id :: gender :: age :: occupation code :: zip."""
    occ = parse_numbers(ut, ut.col(3), "occupation code", np.int64)
    bad = np.flatnonzero((occ < 0) | (occ >= len(F.ML1M_OCCUPATIONS)))
    if bad.size:
        raise DataFormatError(ut.path, int(ut.lines[bad[0]]), f"occupation code {int(occ[bad[0]])} is not in 0..20")
    parts = [
        F.age_bucket_onehot(parse_numbers(ut, ut.col(2), "age", np.int64)),
        F.onehot(ut.col(1), "gender"),
        F.onehot([F.ML1M_OCCUPATIONS[o] for o in occ.tolist()], "occupation", sorted(F.ML1M_OCCUPATIONS)),
    ]
    return _feature_side(ut, "user id", parts)


def _ml1m_movies(mt: Table) -> Side:
    """movies.dat: id :: title :: genres (`|`-separated)."""
    titles = mt.col(1)
    genres = [[g for g in c.split("|") if g] for c in mt.col(2)]
    return _feature_side(mt, "item id", _movies_parts(titles, genres), titles=titles)


def load_movielens_100k(folder: str | os.PathLike[str], name: str = "ml-100k") -> Interactions:
    """GroupLens `ml-100k/`: u.data (tab), u.user and u.item (`|`, latin-1)."""
    return _load_latin1(folder, name, ("u.data", "\t"), ("u.user", "|", 5, _ml100k_users),
                        ("u.item", "|", 5 + len(F.GROUPLENS_GENRES), _ml100k_items))


def load_movielens_1m(folder: str | os.PathLike[str], name: str = "ml-1m") -> Interactions:
    """GroupLens `ml-1m/`: ratings.dat, users.dat, movies.dat (`::`, latin-1)."""
    return _load_latin1(folder, name, ("ratings.dat", "::"), ("users.dat", "::", 5, _ml1m_users),
                        ("movies.dat", "::", 3, _ml1m_movies))


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
