"""RecBole atomic files: `NAME.inter` (+ optional `NAME.user`, `NAME.item`), tab-separated
with a `field:type` header (what `fedmask data fetch ml-100k` writes)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from models.data import features as F
from models.data.assemble import Side, assemble
from models.data.errors import DataFormatError, DatasetNotFoundError
from models.data.tables import Table, check_ids, parse_numbers, read_table, year_of
from models.data.types import Interactions

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


def _read_atomic(path: Path, required: tuple[str, ...]) -> tuple[Table, list[tuple[str, str]], list[str]]:
    """An atomic file: its rows, its (name, type) fields and their names. The header must
    name every field of `required`, and every row must have one column per field."""
    head, tab = read_table(path, "\t", header=True)
    assert head is not None
    fields = _recbole_header(path, head)
    names = [n for n, _ in fields]
    for req in required:
        if req not in names:
            raise DataFormatError(path, 1, f"header has no {req!r} field (found {names})")
    for r, line in zip(tab.rows, tab.lines.tolist()):
        if len(r) != len(fields):
            raise DataFormatError(path, line, f"expected {len(fields)} tab-separated columns, found {len(r)}")
    return tab, fields, names


def _recbole_side(path: Path, id_field: str, what: str) -> Side:
    """A `.user` / `.item` file: ids in `id_field`, the other columns encoded as features
    by name (age, titles, years, genres) or by type (floats, low-cardinality tokens)."""
    tab, fields, names = _read_atomic(path, (id_field,))
    keys = check_ids(tab, tab.col(names.index(id_field)), f"{what} id")
    parts: list[tuple[np.ndarray, tuple[str, ...]]] = []
    titles = None
    for j, (name, typ) in enumerate(fields):
        if name == id_field or name in _SKIP_COLUMNS:
            continue
        col = tab.col(j)
        if name == "age":
            parts.append(F.age_bucket_onehot(parse_numbers(tab, col, "age", np.int64)))
        elif name in _TITLE_COLUMNS:
            titles = np.asarray(col, dtype=object)
        elif name in _YEAR_COLUMNS:
            parts.append(F.zscore_with_missing(year_of(col), "release_year"))
        elif name in _GENRE_COLUMNS:
            parts.append(F.multihot([c.split() for c in col], "genre"))
        elif typ == "float":
            vals = parse_numbers(tab, col, name, np.float64, allow_empty=True)
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
    return Side(path, keys, tab.lines, feats, fnames, titles)


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
    tab, _, names = _read_atomic(p, ("user_id", "item_id"))
    users = check_ids(tab, tab.col(names.index("user_id")), "user id")
    items = check_ids(tab, tab.col(names.index("item_id")), "item id")
    rating = (
        parse_numbers(tab, tab.col(names.index("rating")), "rating", np.float32)
        if "rating" in names
        else np.ones(len(tab), np.float32)
    )
    ts = (
        parse_numbers(tab, tab.col(names.index("timestamp")), "timestamp", np.float64).astype(np.int64)
        if "timestamp" in names
        else np.arange(len(tab), dtype=np.int64)
    )
    user_file, item_file = p.with_name(stem + ".user"), p.with_name(stem + ".item")
    user_side = _recbole_side(user_file, "user_id", "user") if user_file.is_file() else None
    item_side = _recbole_side(item_file, "item_id", "item") if item_file.is_file() else None
    return assemble(name or stem, tab, users, items, rating, ts, user_side, item_side)
