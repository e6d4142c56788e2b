"""Assembling `Interactions` (models/data/types.py) from the parsed columns of a
dataset and its optional side tables; every loader ends here.

Common rules (docs/decisions.md):
- Dense ids are given to the users/items that occur in the interactions, in
  increasing raw-id order (numeric order when every raw id is an integer, else
  string order). Users/items of the side files without interactions are dropped.
- An interaction whose user (item) is not in the side file is a `DataFormatError`
  (unless the side table is not `strict`).
- A repeated (user, item) pair keeps only its latest occurrence (by timestamp,
  then by file order).
- Interactions are returned sorted by (user, timestamp, file order).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.data.errors import DataFormatError
from models.data.tables import Table
from models.data.types import Interactions


@dataclass
class Side:
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
    if np.asarray(values).dtype.kind in "iu":  # already parsed as integers (a numeric CSV)
        return np.asarray(values).astype(np.int64)
    arr = np.asarray(values, dtype=str)
    try:
        return arr.astype(np.int64)
    except (ValueError, OverflowError):
        return arr


def _match_kinds(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if a.dtype.kind == b.dtype.kind:
        return a, b
    return a.astype(str), b.astype(str)


def _lookup(side: Side, keys: np.ndarray, what: str) -> np.ndarray:
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


def assemble(
    name: str,
    tab: Table,
    user_raw: np.ndarray,
    item_raw: np.ndarray,
    rating: np.ndarray,
    timestamp: np.ndarray,
    user_side: Side | None = None,
    item_side: Side | None = None,
) -> Interactions:
    """The `Interactions` of the rows of `tab` (raw ids, ratings and timestamps, one per
    row), by the rules above; side tables give features and titles."""
    n = len(user_raw)
    if n == 0:
        raise DataFormatError(tab.path, None, "no interactions")
    ukeys = _as_keys(user_raw)
    ikeys = _as_keys(item_raw)

    def side_rows(side: Side | None, keys: np.ndarray, what: str) -> np.ndarray | None:
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
    def gather(side: Side | None, rows: np.ndarray | None, dense: np.ndarray, n_ids: int):
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
