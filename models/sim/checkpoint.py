"""Checkpoints of a simulation every K rounds, and the resume (D93).

After round r (0-based) with (r + 1) % K == 0, and before the last round,
every rank writes FOLDER/round-<r>/rank-<k>.pt: what the next round needs
and the run's record so far (the global state, the cohort and DP streams'
states, the best round kept so far with its figures, the round records, the
privacy ledger, the peak figures) and its own shard's private state (the
dense tables' current and kept-best buffers, or the sparse store). Then
rank 0, once every rank has written (a collective), marks the round
complete (FOLDER/round-<r>/COMPLETE) and removes all but the two latest
complete checkpoints.

A run started with the same FOLDER resumes from its latest complete
checkpoint when that checkpoint is of the same run: the same settings (the
fingerprint: the simulation's settings but the output paths, checkpoint
settings and threads) and the same number of ranks; ConfigError otherwise.
Under torchrun with --max-restarts, a rank that dies makes torchrun restart
every rank, and they resume there; the run ends with the global model of an
uninterrupted run, bit for bit (what a round computes depends only on that
state; tests/models/test_sim_checkpoint.py).

Files are written with torch.save and read with torch.load(weights_only=False):
a checkpoint folder is this run's own, trusted like its code.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from models.registry import ConfigError
from models.sim.config import SimulationConfig
from models.sim.private_tables import PrivateTables
from models.sim.ranks import Ranks
from models.sim.sparse_state import SparseTables

KEEP = 2  # complete checkpoints kept
_NOT_RUN = ("save_global", "checkpoint_every", "checkpoint_dir", "threads")


def fingerprint(config: SimulationConfig, world: int) -> str:
    """What makes two runs the same run (see the module doc)."""
    d = {k: v for k, v in dataclasses.asdict(config).items() if k not in _NOT_RUN}
    return hashlib.sha256(json.dumps([d, world], sort_keys=True, default=str).encode()).hexdigest()


def table_state(tables: PrivateTables | SparseTables) -> dict[str, Any]:
    """A shard's private state as plain tensors (dense: the current and the kept-best buffers)."""
    if isinstance(tables, SparseTables):
        return {"sparse": tables}
    best = tables.best
    state = {"current": {k: v.detach().clone() for k, v in tables.take(None).items()},
             "best": None, "best_is_current": best is not None and best == tables.current}  # fmt: skip
    if best is not None and best != tables.current:
        state["best"] = {k: v.detach().clone() for k, v in tables.take(None, "best").items()}
    tables.release()
    return state


def restore_tables(tables: PrivateTables | SparseTables, state: dict[str, Any]) -> PrivateTables | SparseTables:
    """The shard's private state from `table_state` into the tables this run made
    (its placement: RAM or disk); a sparse store is returned as saved."""
    if "sparse" in state:
        tables.close()
        restored: SparseTables = state["sparse"]
        return restored
    assert isinstance(tables, PrivateTables)
    if state["best"] is not None:  # the kept best first, marked; the current one then goes to the other buffer
        _write_all(tables, state["best"])
        tables.keep_best()
    _write_all(tables, state["current"])
    if state["best_is_current"]:
        tables.keep_best()
    tables.release()
    return tables


def _write_all(tables: PrivateTables, part: dict[str, torch.Tensor]) -> None:
    tables.begin_round(covers_all=True)
    tables.put(None, part)
    tables.end_round()


@dataclass
class Checkpoints:
    """One run's checkpoints in `folder`, every `every` rounds (see the module doc)."""

    folder: Path
    every: int
    fingerprint: str
    ranks: Ranks

    def due(self, r: int, rounds: int) -> bool:
        return (r + 1) % self.every == 0 and r < rounds - 1

    def _dir(self, r: int) -> Path:
        return self.folder / f"round-{r}"

    def complete(self) -> list[int]:
        """The rounds with a complete checkpoint, in order."""
        if not self.folder.is_dir():
            return []
        return sorted(int(p.name.split("-")[1]) for p in self.folder.glob("round-*") if (p / "COMPLETE").exists())

    def save(self, r: int, run: dict[str, Any], tables: PrivateTables | SparseTables) -> None:
        d = self._dir(r)
        d.mkdir(parents=True, exist_ok=True)
        state = {"fingerprint": self.fingerprint, "round": r, "run": run, "tables": table_state(tables)}
        tmp = d / f"rank-{self.ranks.rank}.pt.tmp"
        torch.save(state, tmp)
        tmp.replace(d / f"rank-{self.ranks.rank}.pt")
        self.ranks.gather(True)  # every rank has written
        if self.ranks.rank == 0:
            (d / "COMPLETE").write_text(json.dumps({"round": r, "world": self.ranks.world}))
            for old in self.complete()[:-KEEP]:
                shutil.rmtree(self._dir(old), ignore_errors=True)

    def load_latest(self) -> dict[str, Any] | None:
        """This rank's part of the latest complete checkpoint of this run (None: there is none)."""
        done = self.complete()
        if not done:
            return None
        r = done[-1]
        meta = json.loads((self._dir(r) / "COMPLETE").read_text())
        if meta.get("world") != self.ranks.world:
            raise ConfigError(f"--checkpoint-dir {self.folder} holds a run of {meta.get('world')} ranks, not "
                              f"{self.ranks.world}; use another folder")
        state: dict[str, Any] = torch.load(self._dir(r) / f"rank-{self.ranks.rank}.pt", weights_only=False)
        if state["fingerprint"] != self.fingerprint:
            raise ConfigError(f"--checkpoint-dir {self.folder} holds another run's checkpoint (other settings); "
                              "use another folder")
        return state
