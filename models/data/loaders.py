"""Dataset loaders. Every loader returns `Interactions` (models/data/types.py).

Formats:
- RecBole atomic files: `NAME.inter` (+ optional `NAME.user`, `NAME.item`),
  tab-separated with a `field:type` header (what `fedmask data fetch ml-100k` writes).
- GroupLens ml-100k folder: `u.data`, `u.user`, `u.item` (latin-1).
- GroupLens ml-1m folder: `ratings.dat`, `users.dat`, `movies.dat` (`::`, latin-1).
- GroupLens "latest" folder (ml-latest-small): `ratings.csv` (userId,movieId,rating,timestamp)
  and optional `movies.csv` (movieId,title,genres; CSV quoting, UTF-8).
- HetRec 2011 LastFM folder: `user_artists.dat` (+ optional `artists.dat` for names).
- Generic CSV: `user,item,rating[,timestamp]`, header optional.

Common rules (docs/decisions.md):
- Dense ids are given to the users/items that occur in the interactions, in
  increasing raw-id order (numeric order when every raw id is an integer, else
  string order). Users/items of the side files without interactions are dropped.
- An interaction whose user (item) is not in the side file is a `DataFormatError`.
- A repeated (user, item) pair keeps only its latest occurrence (by timestamp,
  then by file order).
- Interactions are returned sorted by (user, timestamp, file order).
- A source without timestamps gets the file order as timestamp.
Side features: see models/data/features.py.
"""

from __future__ import annotations

import csv
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from models.data import features as F
from models.data.fetch import SOURCES, fetch_hint, resolve_data_dir
from models.data.types import Interactions


class DataFormatError(ValueError):
    """A malformed data file: names the file, the 1-based line and the problem."""

    def __init__(self, path: str | os.PathLike[str], line: int | None, problem: str) -> None:
        self.path = Path(path)
        self.line = line
        self.problem = problem
        where = f"{self.path}:{line}" if line is not None else f"{self.path}"
        super().__init__(f"{where}: {problem}")


class DatasetNotFoundError(FileNotFoundError):
    """The dataset is not on disk (the message says how to get it)."""


# =========================================================== reading tables


@dataclass
class _Table:
    path: Path
    rows: list[list[str]]
    lines: np.ndarray  # int64, 1-based line number of each row

    def col(self, j: int) -> list[str]:
        return [r[j] for r in self.rows]

    def __len__(self) -> int:
        return len(self.rows)


def _read_table(
    path: Path,
    sep: str,
    *,
    encoding: str = "utf-8",
    header: bool = False,
    ncols: int | None = None,
    min_cols: int | None = None,
    strip: bool = False,
) -> tuple[list[str] | None, _Table]:
    """Split a delimited text file; blank lines are skipped. Checks column counts."""
    raw_bytes = Path(path).read_bytes()
    try:
        text = raw_bytes.decode(encoding)
    except UnicodeDecodeError as e:
        line = raw_bytes[: e.start].count(b"\n") + 1
        raise DataFormatError(path, line, f"not valid {encoding} text ({e.reason})") from None
    head: list[str] | None = None
    rows: list[list[str]] = []
    lines: list[int] = []
    for i, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        parts = raw.split(sep)
        if strip:
            parts = [p.strip() for p in parts]
        if header and head is None:
            head = parts
            continue
        if ncols is not None and len(parts) != ncols:
            raise DataFormatError(path, i, f"expected {ncols} columns separated by {sep!r}, found {len(parts)}")
        if min_cols is not None and len(parts) < min_cols:
            raise DataFormatError(path, i, f"expected at least {min_cols} columns separated by {sep!r}, found {len(parts)}")
        rows.append(parts)
        lines.append(i)
    if header and head is None:
        raise DataFormatError(path, None, "empty file (no header line)")
    return head, _Table(path, rows, np.asarray(lines, dtype=np.int64))


def _parse_numbers(
    tab: _Table,
    values: Sequence[str],
    what: str,
    dtype: type,
    *,
    finite: bool = True,
    allow_empty: bool = False,
) -> np.ndarray:
    """Vectorised parse; on failure, the first bad value is reported with its line.
    `allow_empty`: empty strings become NaN (float dtypes only)."""
    vals = list(values)
    empty = np.zeros(len(vals), dtype=bool)
    if allow_empty:
        empty = np.array([v == "" for v in vals], dtype=bool)
        vals = ["nan" if e else v for v, e in zip(vals, empty.tolist())]
    try:
        out = np.asarray(vals, dtype=str).astype(np.float64)
        ok = True
    except ValueError:
        ok = False
    if not ok or (finite and not np.isfinite(out[~empty]).all()):
        for k, v in enumerate(vals):
            if empty[k]:
                continue
            try:
                x = float(v)
            except ValueError:
                raise DataFormatError(tab.path, int(tab.lines[k]), f"{what} {v!r} is not a number") from None
            if finite and not math.isfinite(x):
                raise DataFormatError(tab.path, int(tab.lines[k]), f"{what} {v!r} is not a finite number")
        raise AssertionError("unreachable")  # pragma: no cover
    if dtype is np.int64:
        bad = np.flatnonzero(out != np.round(out))
        if bad.size:
            k = int(bad[0])
            raise DataFormatError(tab.path, int(tab.lines[k]), f"{what} {vals[k]!r} is not an integer")
        return out.astype(np.int64)
    return out.astype(dtype)


def _check_ids(tab: _Table, values: Sequence[str], what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=str)
    empty = np.flatnonzero(np.char.str_len(arr) == 0) if arr.size else np.empty(0, np.int64)
    if empty.size:
        raise DataFormatError(tab.path, int(tab.lines[empty[0]]), f"empty {what}")
    return arr


# =========================================================== assembling Interactions


@dataclass
class _Side:
    """A side table (users or items) keyed by raw id (as strings)."""

    path: Path
    keys: np.ndarray  # str (n,)
    lines: np.ndarray
    features: np.ndarray | None
    names: tuple[str, ...]
    titles: np.ndarray | None = None
    strict: bool = True  # interactions must only reference keys of this table


def _as_keys(values: np.ndarray) -> np.ndarray:
    """Raw ids as int64 when every one is an integer ("007" == "7"), else as strings."""
    arr = np.asarray(values, dtype=str)
    try:
        return arr.astype(np.int64)
    except (ValueError, OverflowError):
        return arr


def _match_kinds(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if a.dtype.kind == b.dtype.kind:
        return a, b
    return a.astype(str), b.astype(str)


def _lookup(side: _Side, keys: np.ndarray, what: str) -> np.ndarray:
    """Row of each key in the side table (-1 when absent); duplicate side ids are errors."""
    skeys, keys = _match_kinds(_as_keys(side.keys), keys)
    order = np.argsort(skeys, kind="stable")
    srt = skeys[order]
    dup = np.flatnonzero(srt[1:] == srt[:-1])
    if dup.size:
        row = int(order[dup[0] + 1])
        raise DataFormatError(side.path, int(side.lines[row]), f"duplicate {what} id {side.keys[row]!r}")
    if len(srt) == 0:
        return np.full(len(keys), -1, dtype=np.int64)
    pos = np.minimum(np.searchsorted(srt, keys), len(srt) - 1)
    return np.where(srt[pos] == keys, order[pos], -1).astype(np.int64)


def _assemble(
    name: str,
    tab: _Table,
    user_raw: np.ndarray,
    item_raw: np.ndarray,
    rating: np.ndarray,
    timestamp: np.ndarray,
    user_side: _Side | None = None,
    item_side: _Side | None = None,
) -> Interactions:
    n = len(user_raw)
    if n == 0:
        raise DataFormatError(tab.path, None, "no interactions")
    ukeys = _as_keys(user_raw)
    ikeys = _as_keys(item_raw)

    def side_rows(side: _Side | None, keys: np.ndarray, what: str) -> np.ndarray | None:
        if side is None:
            return None
        rows = _lookup(side, keys, what)
        missing = np.flatnonzero(rows < 0)
        if missing.size and side.strict:
            k = int(missing[0])
            raise DataFormatError(
                tab.path, int(tab.lines[k]), f"unknown {what} id {str(keys[k])!r} (not in {side.path.name})"
            )
        return rows

    urow = side_rows(user_side, ukeys, "user")
    irow = side_rows(item_side, ikeys, "item")

    # dense ids in raw-id order
    raw_users, u_dense = np.unique(ukeys, return_inverse=True)
    raw_items, i_dense = np.unique(ikeys, return_inverse=True)
    u_dense = u_dense.astype(np.int64)
    i_dense = i_dense.astype(np.int64)
    if raw_users.dtype.kind != "i":
        raw_users = raw_users.astype(object)
    if raw_items.dtype.kind != "i":
        raw_items = raw_items.astype(object)

    # dedupe (user, item): keep the latest by (timestamp, file order)
    order = np.arange(n)
    srt = np.lexsort((order, timestamp, i_dense, u_dense))
    last = np.ones(n, dtype=bool)
    same = (u_dense[srt][1:] == u_dense[srt][:-1]) & (i_dense[srt][1:] == i_dense[srt][:-1])
    last[:-1] = ~same
    keep = srt[last]
    keep = keep[np.lexsort((order[keep], timestamp[keep], u_dense[keep]))]

    # every user/item kept still occurs (dedup keeps one row per pair), so dense ids stay dense
    def gather(side: _Side | None, rows: np.ndarray | None, dense: np.ndarray, n_ids: int):
        if side is None or rows is None:
            return None, (), None
        per_id = np.full(n_ids, -1, dtype=np.int64)
        per_id[dense] = rows
        feats = None
        if side.features is not None:
            feats = np.zeros((n_ids, side.features.shape[1]), dtype=np.float32)
            ok = per_id >= 0
            feats[ok] = side.features[per_id[ok]]
        titles = None
        if side.titles is not None:
            titles = np.array([side.titles[r] if r >= 0 else "" for r in per_id.tolist()], dtype=object)
        return feats, side.names if feats is not None else (), titles

    uf, ufn, _ = gather(user_side, urow, u_dense, len(raw_users))
    itf, ifn, titles = gather(item_side, irow, i_dense, len(raw_items))
    return Interactions(
        name=name,
        user=u_dense[keep].astype(np.int64),
        item=i_dense[keep].astype(np.int64),
        rating=np.asarray(rating, dtype=np.float32)[keep],
        timestamp=np.asarray(timestamp, dtype=np.int64)[keep],
        n_users=len(raw_users),
        n_items=len(raw_items),
        raw_user_ids=raw_users,
        raw_item_ids=raw_items,
        user_features=uf,
        item_features=itf,
        user_feature_names=tuple(ufn),
        item_feature_names=tuple(ifn),
        item_titles=titles,
    )


def _year_of(values: Sequence[str]) -> np.ndarray:
    """Four-digit year at the end of each string (release dates, years, titles); NaN if none."""
    pat = re.compile(r"(\d{4})\)?\s*$")
    out = np.full(len(values), np.nan)
    for k, v in enumerate(values):
        m = pat.search(v)
        if m:
            out[k] = float(m.group(1))
    return out


# =========================================================== RecBole atomic files

_RECBOLE_TYPES = {"token", "token_seq", "float", "float_seq"}
_MAX_ONEHOT = 64  # generic token columns with more distinct values are not encoded
_SKIP_COLUMNS = {"zip_code", "zip", "url", "imdb_url"}
_TITLE_COLUMNS = {"movie_title", "title", "name", "item_name"}
_YEAR_COLUMNS = {"release_year", "year"}
_GENRE_COLUMNS = {"class", "genre", "genres"}


def _recbole_header(path: Path, head: list[str]) -> list[tuple[str, str]]:
    fields = []
    for h in head:
        name, colon, typ = h.partition(":")
        if not colon or typ not in _RECBOLE_TYPES or not name:
            raise DataFormatError(
                path, 1, f"bad header field {h!r}: expected NAME:TYPE with TYPE in {sorted(_RECBOLE_TYPES)}"
            )
        fields.append((name, typ))
    return fields


def _recbole_side(path: Path, id_field: str, what: str) -> _Side:
    head, tab = _read_table(path, "\t", header=True)
    assert head is not None
    fields = _recbole_header(path, head)
    names = [n for n, _ in fields]
    if id_field not in names:
        raise DataFormatError(path, 1, f"header has no {id_field!r} field (found {names})")
    for r, line in zip(tab.rows, tab.lines.tolist()):
        if len(r) != len(fields):
            raise DataFormatError(path, line, f"expected {len(fields)} tab-separated columns, found {len(r)}")
    keys = _check_ids(tab, tab.col(names.index(id_field)), f"{what} id")
    parts: list[tuple[np.ndarray, tuple[str, ...]]] = []
    titles = None
    for j, (name, typ) in enumerate(fields):
        if name == id_field or name in _SKIP_COLUMNS:
            continue
        col = tab.col(j)
        if name == "age":
            parts.append(F.age_bucket_onehot(_parse_numbers(tab, col, "age", np.int64)))
        elif name in _TITLE_COLUMNS:
            titles = np.asarray(col, dtype=object)
        elif name in _YEAR_COLUMNS:
            parts.append(F.zscore_with_missing(_year_of(col), "release_year"))
        elif name in _GENRE_COLUMNS:
            parts.append(F.multihot([c.split() for c in col], "genre"))
        elif typ == "float":
            vals = _parse_numbers(tab, col, name, np.float64, allow_empty=True)
            parts.append(F.zscore_with_missing(vals, name))
        elif typ == "token":
            if len(set(col)) <= _MAX_ONEHOT:
                parts.append(F.onehot(col, name))
        elif typ == "token_seq":
            lists = [c.split() for c in col]
            if len({t for lst in lists for t in lst}) <= _MAX_ONEHOT:
                parts.append(F.multihot(lists, name))
        # float_seq and high-cardinality tokens: not encoded
    # same column order as the GroupLens loaders: age, gender, occupation, genres, year, others
    prio = {"age": 0, "gender": 1, "occupation": 2, "genre": 3, "release_year": 4}
    parts.sort(key=lambda part: prio.get(part[1][0].split(":")[0], 5) if part[1] else 5)
    feats, fnames = F.concat(parts, len(tab))
    return _Side(path, keys, tab.lines, feats, fnames, titles)


def load_recbole(path: str | os.PathLike[str], name: str | None = None) -> Interactions:
    """RecBole atomic files. `path` is the `.inter` file or a folder holding exactly one."""
    p = Path(path)
    if p.is_dir():
        inters = sorted(p.glob("*.inter"))
        if len(inters) != 1:
            raise DatasetNotFoundError(f"{p}: expected exactly one *.inter file, found {len(inters)}")
        p = inters[0]
    if not p.is_file():
        raise DatasetNotFoundError(f"{p}: no such file")
    stem = p.name[: -len(".inter")] if p.name.endswith(".inter") else p.stem
    head, tab = _read_table(p, "\t", header=True)
    assert head is not None
    fields = _recbole_header(p, head)
    names = [n for n, _ in fields]
    for req in ("user_id", "item_id"):
        if req not in names:
            raise DataFormatError(p, 1, f"header has no {req!r} field (found {names})")
    for r, line in zip(tab.rows, tab.lines.tolist()):
        if len(r) != len(fields):
            raise DataFormatError(p, line, f"expected {len(fields)} tab-separated columns, found {len(r)}")
    users = _check_ids(tab, tab.col(names.index("user_id")), "user id")
    items = _check_ids(tab, tab.col(names.index("item_id")), "item id")
    rating = (
        _parse_numbers(tab, tab.col(names.index("rating")), "rating", np.float32)
        if "rating" in names
        else np.ones(len(tab), np.float32)
    )
    ts = (
        _parse_numbers(tab, tab.col(names.index("timestamp")), "timestamp", np.float64).astype(np.int64)
        if "timestamp" in names
        else np.arange(len(tab), dtype=np.int64)
    )
    user_file, item_file = p.with_name(stem + ".user"), p.with_name(stem + ".item")
    user_side = _recbole_side(user_file, "user_id", "user") if user_file.is_file() else None
    item_side = _recbole_side(item_file, "item_id", "item") if item_file.is_file() else None
    return _assemble(name or stem, tab, users, items, rating, ts, user_side, item_side)


# =========================================================== GroupLens MovieLens


def load_movielens_100k(folder: str | os.PathLike[str], name: str = "ml-100k") -> Interactions:
    """GroupLens `ml-100k/`: u.data (tab), u.user and u.item (`|`, latin-1)."""
    d = Path(folder)
    _, tab = _read_table(d / "u.data", "\t", encoding="latin-1", ncols=4)
    users = _check_ids(tab, tab.col(0), "user id")
    items = _check_ids(tab, tab.col(1), "item id")
    rating = _parse_numbers(tab, tab.col(2), "rating", np.float32)
    ts = _parse_numbers(tab, tab.col(3), "timestamp", np.int64)

    user_side = None
    if (d / "u.user").is_file():
        _, ut = _read_table(d / "u.user", "|", encoding="latin-1", ncols=5)
        parts = [
            F.age_bucket_onehot(_parse_numbers(ut, ut.col(1), "age", np.int64)),
            F.onehot(ut.col(2), "gender"),
            F.onehot(ut.col(3), "occupation"),
        ]
        feats, fnames = F.concat(parts, len(ut))
        user_side = _Side(ut.path, _check_ids(ut, ut.col(0), "user id"), ut.lines, feats, fnames)

    item_side = None
    if (d / "u.item").is_file():
        n_genres = len(F.GROUPLENS_GENRES)
        _, it = _read_table(d / "u.item", "|", encoding="latin-1", ncols=5 + n_genres)
        flags = np.zeros((len(it), n_genres), dtype=np.float32)
        for g in range(n_genres):
            col = it.col(5 + g)
            v = _parse_numbers(it, col, f"genre flag {F.GROUPLENS_GENRES[g]!r}", np.int64)
            bad = np.flatnonzero((v != 0) & (v != 1))
            if bad.size:
                raise DataFormatError(it.path, int(it.lines[bad[0]]), f"genre flag {col[bad[0]]!r} is not 0 or 1")
            flags[:, g] = v
        present = np.asarray(flags.any(axis=0), dtype=bool)
        genre_part = (flags[:, present], tuple(f"genre:{g}" for g, p in zip(F.GROUPLENS_GENRES, present) if p))
        parts = [genre_part, F.zscore_with_missing(_year_of(it.col(2)), "release_year")]
        feats, fnames = F.concat(parts, len(it))
        item_side = _Side(
            it.path, _check_ids(it, it.col(0), "item id"), it.lines, feats, fnames,
            titles=np.asarray(it.col(1), dtype=object),
        )  # fmt: skip
    return _assemble(name, tab, users, items, rating, ts, user_side, item_side)


def load_movielens_1m(folder: str | os.PathLike[str], name: str = "ml-1m") -> Interactions:
    """GroupLens `ml-1m/`: ratings.dat, users.dat, movies.dat (`::`, latin-1)."""
    d = Path(folder)
    _, tab = _read_table(d / "ratings.dat", "::", encoding="latin-1", ncols=4)
    users = _check_ids(tab, tab.col(0), "user id")
    items = _check_ids(tab, tab.col(1), "item id")
    rating = _parse_numbers(tab, tab.col(2), "rating", np.float32)
    ts = _parse_numbers(tab, tab.col(3), "timestamp", np.int64)

    user_side = None
    if (d / "users.dat").is_file():
        _, ut = _read_table(d / "users.dat", "::", encoding="latin-1", ncols=5)
        occ = _parse_numbers(ut, ut.col(3), "occupation code", np.int64)
        bad = np.flatnonzero((occ < 0) | (occ >= len(F.ML1M_OCCUPATIONS)))
        if bad.size:
            raise DataFormatError(ut.path, int(ut.lines[bad[0]]), f"occupation code {int(occ[bad[0]])} is not in 0..20")
        parts = [
            F.age_bucket_onehot(_parse_numbers(ut, ut.col(2), "age", np.int64)),
            F.onehot(ut.col(1), "gender"),
            F.onehot([F.ML1M_OCCUPATIONS[o] for o in occ.tolist()], "occupation", sorted(F.ML1M_OCCUPATIONS)),
        ]
        feats, fnames = F.concat(parts, len(ut))
        user_side = _Side(ut.path, _check_ids(ut, ut.col(0), "user id"), ut.lines, feats, fnames)

    item_side = None
    if (d / "movies.dat").is_file():
        _, mt = _read_table(d / "movies.dat", "::", encoding="latin-1", ncols=3)
        titles = mt.col(1)
        genres = [[g for g in c.split("|") if g] for c in mt.col(2)]
        parts = [F.multihot(genres, "genre"), F.zscore_with_missing(_year_of(titles), "release_year")]
        feats, fnames = F.concat(parts, len(mt))
        item_side = _Side(
            mt.path, _check_ids(mt, mt.col(0), "item id"), mt.lines, feats, fnames,
            titles=np.asarray(titles, dtype=object),
        )  # fmt: skip
    return _assemble(name, tab, users, items, rating, ts, user_side, item_side)


def _read_csv_rows(path: Path, header: list[str]) -> _Table:
    """A UTF-8 CSV file (RFC 4180 quoting) whose first line must be `header`."""
    rows: list[list[str]] = []
    lines: list[int] = []
    try:
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.reader(f)
            head = next(reader, None)
            if head is None:
                raise DataFormatError(path, None, "empty file (no header line)")
            if [h.strip() for h in head] != header:
                raise DataFormatError(path, 1, f"expected header {','.join(header)}, found {','.join(head)}")
            for r in reader:
                if not r or all(not c.strip() for c in r):
                    continue
                if len(r) != len(header):
                    raise DataFormatError(path, reader.line_num, f"expected {len(header)} columns, found {len(r)}")
                rows.append(r)
                lines.append(reader.line_num)
    except UnicodeDecodeError as e:
        raise DataFormatError(path, None, f"not valid utf-8 text ({e.reason})") from None
    return _Table(path, rows, np.asarray(lines, dtype=np.int64))


def load_movielens_latest(folder: str | os.PathLike[str], name: str = "ml-latest-small") -> Interactions:
    """GroupLens "latest" layout (ml-latest-small): ratings.csv + optional movies.csv.

    Ratings are explicit (0.5..5 in half stars), timestamps in seconds. movies.csv
    gives titles, a genre multi-hot ("(no genres listed)" is no genre) and the
    release year from the title; it lists movies nobody rated, which are dropped.
    """
    d = Path(folder)
    tab = _read_csv_rows(d / "ratings.csv", ["userId", "movieId", "rating", "timestamp"])
    users = _check_ids(tab, tab.col(0), "user id")
    items = _check_ids(tab, tab.col(1), "movie id")
    rating = _parse_numbers(tab, tab.col(2), "rating", np.float32)
    ts = _parse_numbers(tab, tab.col(3), "timestamp", np.int64)
    item_side = None
    if (d / "movies.csv").is_file():
        mt = _read_csv_rows(d / "movies.csv", ["movieId", "title", "genres"])
        titles = [t.strip() for t in mt.col(1)]
        genres = [[g for g in c.split("|") if g and g != "(no genres listed)"] for c in mt.col(2)]
        parts = [F.multihot(genres, "genre"), F.zscore_with_missing(_year_of(titles), "release_year")]
        feats, fnames = F.concat(parts, len(mt))
        item_side = _Side(
            mt.path, _check_ids(mt, mt.col(0), "movie id"), mt.lines, feats, fnames,
            titles=np.asarray(titles, dtype=object),
        )  # fmt: skip
    return _assemble(name, tab, users, items, rating, ts, None, item_side)


# =========================================================== HetRec LastFM


def load_lastfm(
    folder: str | os.PathLike[str],
    name: str = "lastfm",
    rating: Literal["binary", "log"] = "binary",
) -> Interactions:
    """HetRec 2011 LastFM: `user_artists.dat` (userID, artistID, weight; tab, header).

    Implicit: rating = 1 (`binary`) or log(1 + play count) (`log`); timestamp = file
    order (the file has none). `artists.dat`, when present, gives artist names
    (unknown artists just get an empty name).
    """
    d = Path(folder)
    head, tab = _read_table(d / "user_artists.dat", "\t", encoding="utf-8", header=True, ncols=3)
    assert head is not None
    if [h.lower() for h in head] != ["userid", "artistid", "weight"]:
        raise DataFormatError(tab.path, 1, f"expected header userID artistID weight, found {head}")
    users = _check_ids(tab, tab.col(0), "user id")
    items = _check_ids(tab, tab.col(1), "artist id")
    w = _parse_numbers(tab, tab.col(2), "weight", np.float64)
    neg = np.flatnonzero(w < 0)
    if neg.size:
        raise DataFormatError(tab.path, int(tab.lines[neg[0]]), f"negative weight {tab.col(2)[neg[0]]!r}")
    if rating == "binary":
        r = np.ones(len(tab), np.float32)
    elif rating == "log":
        r = np.log1p(w).astype(np.float32)
    else:
        raise ValueError(f"rating must be 'binary' or 'log', not {rating!r}")
    ts = np.arange(len(tab), dtype=np.int64)
    item_side = None
    if (d / "artists.dat").is_file():
        ah, at = _read_table(d / "artists.dat", "\t", encoding="utf-8", header=True, min_cols=2, strip=True)
        item_side = _Side(
            at.path, _check_ids(at, at.col(0), "artist id"), at.lines, None, (),
            titles=np.asarray(at.col(1), dtype=object), strict=False,
        )  # fmt: skip
    return _assemble(name, tab, users, items, r, ts, None, item_side)


# =========================================================== generic CSV


def load_csv(path: str | os.PathLike[str], name: str | None = None) -> Interactions:
    """`user,item,rating[,timestamp]`; a first line whose rating is not numeric is a header."""
    p = Path(path)
    rows: list[list[str]] = []
    lines: list[int] = []
    with open(p, encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        for r in reader:
            if not r or all(not c.strip() for c in r):
                continue
            rows.append([c.strip() for c in r])
            lines.append(reader.line_num)
    if not rows:
        raise DataFormatError(p, None, "empty file")
    first = rows[0]
    if len(first) >= 3:
        try:
            float(first[2])
        except ValueError:
            rows, lines = rows[1:], lines[1:]
    if not rows:
        raise DataFormatError(p, None, "no interactions (only a header)")
    width = len(rows[0])
    if width not in (3, 4):
        raise DataFormatError(p, lines[0], f"expected 3 or 4 columns (user,item,rating[,timestamp]), found {width}")
    for r, ln in zip(rows, lines):
        if len(r) != width:
            raise DataFormatError(p, ln, f"expected {width} columns like the first row, found {len(r)}")
    tab = _Table(p, rows, np.asarray(lines, dtype=np.int64))
    users = _check_ids(tab, tab.col(0), "user id")
    items = _check_ids(tab, tab.col(1), "item id")
    rating = _parse_numbers(tab, tab.col(2), "rating", np.float32)
    ts = (
        _parse_numbers(tab, tab.col(3), "timestamp", np.float64).astype(np.int64)
        if width == 4
        else np.arange(len(tab), dtype=np.int64)
    )
    return _assemble(name or p.stem, tab, users, items, rating, ts)


# =========================================================== dispatch

Format = Literal["recbole", "ml-100k", "ml-1m", "ml-latest", "lastfm", "csv"]


def detect_format(path: str | os.PathLike[str]) -> Format:
    p = Path(path)
    if p.is_file():
        if p.suffix.lower() == ".csv":
            return "csv"
        if p.suffix == ".inter":
            return "recbole"
        raise DatasetNotFoundError(f"{p}: unknown file type (expected a .csv or a RecBole .inter file)")
    if not p.is_dir():
        raise DatasetNotFoundError(f"{p}: no such file or folder")
    if len(list(p.glob("*.inter"))) == 1:
        return "recbole"
    if (p / "u.data").is_file():
        return "ml-100k"
    if (p / "ratings.dat").is_file():
        return "ml-1m"
    if (p / "user_artists.dat").is_file():
        return "lastfm"
    if (p / "ratings.csv").is_file():
        return "ml-latest"
    raise DatasetNotFoundError(
        f"{p}: cannot tell the format; expected one NAME.inter (RecBole), u.data (ml-100k), "
        "ratings.dat (ml-1m), user_artists.dat (HetRec LastFM) or ratings.csv (ml-latest-small)"
    )


_LOADERS = {
    "recbole": load_recbole,
    "ml-100k": load_movielens_100k,
    "ml-1m": load_movielens_1m,
    "ml-latest": load_movielens_latest,
    "lastfm": load_lastfm,
    "csv": load_csv,
}


def load_dataset(
    name_or_path: str | os.PathLike[str], data_dir: str | os.PathLike[str] | None = None
) -> Interactions:
    """Load by dataset name (`ml-100k` -> `<data_dir>/ml-100k/`), folder or `.csv` file.

    `data_dir` defaults as in `fedmask data fetch` ($FEDMASK_DATA_DIR, else ./data).
    """
    s = str(name_or_path)
    p = Path(s)
    looks_like_path = p.suffix != "" or os.sep in s or (os.altsep is not None and os.altsep in s) or s.startswith(".")
    if looks_like_path or (p.exists() and s not in SOURCES):
        fmt = detect_format(p)
        return _LOADERS[fmt](p)
    d = resolve_data_dir(data_dir) / s
    if not d.is_dir():
        if s in SOURCES:
            raise DatasetNotFoundError(f"dataset {s!r} not found in {d}; {fetch_hint(s)}")
        raise DatasetNotFoundError(
            f"dataset {s!r} not found in {d}: put its files there (fetchable by name: {', '.join(sorted(SOURCES))})"
        )
    try:
        fmt = detect_format(d)
    except DatasetNotFoundError as e:
        if s in SOURCES:
            raise DatasetNotFoundError(f"{e}; {fetch_hint(s)}") from None
        raise
    return _LOADERS[fmt](d, name=s)


def filter_users(interactions: Interactions, min_interactions: int) -> Interactions:
    """Keep users with at least `min_interactions` interactions (the FedRAP paper uses 10),
    re-densifying user and item ids (items left without interactions are dropped)."""
    x = interactions
    counts = np.bincount(x.user, minlength=x.n_users)
    keep_u = counts >= min_interactions
    rows = keep_u[x.user]
    items_left = np.zeros(x.n_items, dtype=bool)
    items_left[x.item[rows]] = True
    umap = np.cumsum(keep_u) - 1
    imap = np.cumsum(items_left) - 1
    return Interactions(
        name=x.name,
        user=umap[x.user[rows]].astype(np.int64),
        item=imap[x.item[rows]].astype(np.int64),
        rating=x.rating[rows],
        timestamp=x.timestamp[rows],
        n_users=int(keep_u.sum()),
        n_items=int(items_left.sum()),
        raw_user_ids=x.raw_user_ids[keep_u],
        raw_item_ids=x.raw_item_ids[items_left],
        user_features=None if x.user_features is None else x.user_features[keep_u],
        item_features=None if x.item_features is None else x.item_features[items_left],
        user_feature_names=x.user_feature_names,
        item_feature_names=x.item_feature_names,
        item_titles=None if x.item_titles is None else x.item_titles[items_left],
    )
