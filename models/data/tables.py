"""Reading the text tables of the dataset loaders: delimited and CSV files split into rows
that remember their 1-based line numbers, and vectorised parsing of their columns. Every
problem is a `DataFormatError` naming the file and the line."""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.data.errors import DataFormatError


@dataclass
class Table:
    """The non-blank rows of a text file, split into columns (strings)."""

    path: Path
    rows: list[list[str]]
    lines: np.ndarray  # int64, 1-based line number of each row

    def col(self, j: int) -> list[str]:
        return [r[j] for r in self.rows]

    def __len__(self) -> int:
        return len(self.rows)


def read_table(
    path: Path,
    sep: str,
    *,
    encoding: str = "utf-8",
    header: bool = False,
    ncols: int | None = None,
    min_cols: int | None = None,
    strip: bool = False,
) -> tuple[list[str] | None, Table]:
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
    return head, Table(path, rows, np.asarray(lines, dtype=np.int64))


def parse_numbers(
    tab: Table,
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


def check_ids(tab: Table, values: Sequence[str], what: str) -> np.ndarray:
    """The ids of a column as a string array; an empty id is an error."""
    arr = np.asarray(values, dtype=str)
    empty = np.flatnonzero(np.char.str_len(arr) == 0) if arr.size else np.empty(0, np.int64)
    if empty.size:
        raise DataFormatError(tab.path, int(tab.lines[empty[0]]), f"empty {what}")
    return arr


def read_csv_rows(path: Path, header: list[str]) -> Table:
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
    return Table(path, rows, np.asarray(lines, dtype=np.int64))


def year_of(values: Sequence[str]) -> np.ndarray:
    """Four-digit year at the end of each string (release dates, years, titles); NaN if none."""
    pat = re.compile(r"(\d{4})\)?\s*$")
    out = np.full(len(values), np.nan)
    for k, v in enumerate(values):
        m = pat.search(v)
        if m:
            out[k] = float(m.group(1))
    return out

