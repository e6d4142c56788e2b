"""Generic CSV interactions: `user,item,rating[,timestamp]`, header optional."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

from models.data.assemble import assemble
from models.data.errors import DataFormatError
from models.data.tables import Table, check_ids, parse_numbers
from models.data.types import Interactions


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
    tab = Table(p, rows, np.asarray(lines, dtype=np.int64))
    users = check_ids(tab, tab.col(0), "user id")
    items = check_ids(tab, tab.col(1), "item id")
    rating = parse_numbers(tab, tab.col(2), "rating", np.float32)
    ts = (
        parse_numbers(tab, tab.col(3), "timestamp", np.float64).astype(np.int64)
        if width == 4
        else np.arange(len(tab), dtype=np.int64)
    )
    return assemble(name or p.stem, tab, users, items, rating, ts)
