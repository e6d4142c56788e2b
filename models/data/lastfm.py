"""HetRec 2011 LastFM folder: `user_artists.dat` (+ optional `artists.dat` for names)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import numpy as np

from models.data.assemble import Side, assemble
from models.data.errors import DataFormatError
from models.data.tables import check_ids, parse_numbers, read_table
from models.data.types import Interactions


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
    head, tab = read_table(d / "user_artists.dat", "\t", encoding="utf-8", header=True, ncols=3)
    assert head is not None
    if [h.lower() for h in head] != ["userid", "artistid", "weight"]:
        raise DataFormatError(tab.path, 1, f"expected header userID artistID weight, found {head}")
    users = check_ids(tab, tab.col(0), "user id")
    items = check_ids(tab, tab.col(1), "artist id")
    w = parse_numbers(tab, tab.col(2), "weight", np.float64)
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
        ah, at = read_table(d / "artists.dat", "\t", encoding="utf-8", header=True, min_cols=2, strip=True)
        item_side = Side(
            at.path, check_ids(at, at.col(0), "artist id"), at.lines, None, (),
            titles=np.asarray(at.col(1), dtype=object), strict=False,
        )  # fmt: skip
    return assemble(name, tab, users, items, r, ts, None, item_side)
