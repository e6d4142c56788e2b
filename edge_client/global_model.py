"""The latest global model this client trained from, kept for queries.

Global parameters are public (every device of the round receives them).
`LatestGlobal.remember(task)` keeps the task's model, version,
hyper-parameters and parameters in memory and, when a path is given,
writes them atomically to that file (the state dir's `global.fms`), so
that top-k queries are answered after a restart too. `latest()` is None
until a model has been remembered in this process or in an earlier one.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from edge_client.state import read_arrays, write_arrays
from edge_client.task import TaskSpec

_PREFIX = "g_"


class LatestGlobal:
    def __init__(self, path: os.PathLike[str] | str | None = None) -> None:
        self.path = None if path is None else Path(path)
        self._latest: TaskSpec | None = None

    def remember(self, task: TaskSpec) -> None:
        self._latest = task
        if self.path is None:
            return
        write_arrays(
            self.path,
            {f"{_PREFIX}{k}": np.asarray(v, dtype=np.float32) for k, v in task.global_params.items()},
            {
                "kind": "global",
                "model": task.model_name,
                "model_version": int(task.model_version),
                "round_number": int(task.round_number),
                "hyperparameters": dict(task.hyperparameters),
            },
        )

    def latest(self) -> TaskSpec | None:
        """The remembered task (round_idx 0 and vector_length 0 when read from disk)."""
        if self._latest is not None or self.path is None:
            return self._latest
        got = read_arrays(self.path)
        if got is None:
            return None
        arrays, meta = got
        self._latest = TaskSpec(
            model_name=str(meta["model"]),
            model_version=int(meta["model_version"]),
            round_number=int(meta["round_number"]),
            round_idx=0,
            hyperparameters=dict(meta.get("hyperparameters", {})),
            global_params={k[len(_PREFIX):]: v for k, v in arrays.items() if k.startswith(_PREFIX)},
            vector_length=0,
        )
        return self._latest
