"""Command-line options that name a dataset, shared by the commands that load one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

DataDirOption = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        envvar="FEDMASK_DATA_DIR",
        help="Folder holding the datasets (default: ./data).",
        show_default=False,
    ),
]
# `fedmask simulate` and `fedmask reference`: the same names load the same data (and split, with the same seed)
DatasetOption = Annotated[
    str, typer.Option(help="Dataset name under --data-dir (ml-100k), a folder or .csv, or 'synthetic'.")
]
