"""The errors of the dataset loaders (models/data/loaders.py and the per-format modules)."""

from __future__ import annotations

import os
from pathlib import Path


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

