"""Loading a dataset by name, folder or file. Every loader returns `Interactions`
(models/data/types.py), one module per format:

- RecBole atomic files (`NAME.inter` + optional `.user`, `.item`): models/data/recbole.py.
- GroupLens ml-100k, ml-1m and "latest" (ml-latest-small) folders: models/data/grouplens.py.
- HetRec 2011 LastFM folder: models/data/lastfm.py.
- Generic CSV `user,item,rating[,timestamp]`: models/data/generic_csv.py.

The rules they share (dense ids, side tables, deduplication, order) are in
models/data/assemble.py; a source without timestamps gets the file order as timestamp.
Errors: models/data/errors.py. Side features: models/data/features.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import numpy as np

from models.data.errors import DatasetNotFoundError
from models.data.fetch import SOURCES, fetch_hint, resolve_data_dir
from models.data.generic_csv import load_csv
from models.data.grouplens import load_movielens_1m, load_movielens_100k, load_movielens_latest
from models.data.lastfm import load_lastfm
from models.data.recbole import load_recbole
from models.data.types import Interactions

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
