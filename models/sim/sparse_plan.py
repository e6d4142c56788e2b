"""The memory plan of a run whose private state is kept sparsely (D89).

Like `models/sim/memory.py`, pure arithmetic over sizes the engine measures:
one device's dense private tensors, the expected rows each device touches in a
round (`SparseTraining.touched_rows`, from its number of training positives),
the bytes of the global tensors the rows are relative to. What it predicts:

- the private state's bytes after r rounds (`state_bytes`, what
  `SparseTables.nbytes` measures between rounds): the dense tensors, plus for a
  model with private rows (PFedRec) the rows of every device that has trained
  (a device takes part in a round with probability q = cohort / population, so
  after r rounds with probability 1 - (1 - q)^r; its rows are those of its last
  round, in expectation the rows it touches in a round), the per-device index
  (four int64) and the distinct global tensors the devices refer to (the base of
  round s, 1 <= s < r, is referred to while some device's last round is s, which
  for each device has probability q (1 - q)^(r-1-s); round 0's while some device
  has not trained since, probability (1 - q)^(r-1));
- the chunk: the most devices whose training working set
  (`SparseTraining.sparse_train_bytes`) fits the budget and CALL_BYTES (a call
  that large is already fully vectorised; larger ones only cost memory);
- the peak: the state after the last round, the global tensors, the training
  working set of a chunk of devices, the
  round's sum (float64, update_dim) or, with DP or SecAgg, the cohort's updates
  as rows plus their dense form (a chunk of devices with DP; the whole cohort
  with SecAgg, which runs one protocol over every device's dense input), and the
  evaluation of a batch (the gathered rows of every item of EVAL_BATCH devices).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from models.sim.memory import EVAL_BATCH, MemoryBudgetError, gib
from models.sparse import SparseTraining

GARBAGE_SLACK = 1.0 / 32.0  # the blocks' garbage: between 0 and 1/16 of the live rows (models/sim/sparse_state.py)
CALL_BYTES = 1024**3  # training tensors of one local_update_sparse call, at most (unless --cohort-chunk)


@dataclass(frozen=True)
class StateShape:
    """What the state's bytes depend on."""

    population: int
    cohort: int
    dense_per_device: int  # bytes of one device's dense private tensors
    rows_total: float  # expected rows of all devices after one round each
    row_bytes: int  # bytes of one stored row (item id and values)
    base_bytes: int  # bytes of the global tensors one base holds (0: no private rows)

    def state_bytes(self, rounds: int) -> int:
        """Expected bytes of the private state after `rounds` rounds (see the module doc)."""
        n = self.population
        dense = n * self.dense_per_device
        if self.base_bytes == 0:
            return dense
        q = self.cohort / n
        trained = 1.0 - (1.0 - q) ** rounds
        rows = trained * self.rows_total * self.row_bytes * (1.0 + GARBAGE_SLACK if q < 1.0 else 1.0)
        return int(dense + 4 * 8 * n + rows + self.bases(rounds) * self.base_bytes)

    def bases(self, rounds: int) -> float:
        """Expected number of distinct global tensors referred to after `rounds` rounds."""
        if rounds <= 1:
            return 1.0
        n, q = self.population, self.cohort / self.population
        s = torch.arange(1, rounds, dtype=torch.float64)
        p = q * (1.0 - q) ** (rounds - 1 - s)
        p0 = torch.tensor((1.0 - q) ** (rounds - 1), dtype=torch.float64)
        return float((1.0 - (1.0 - p) ** n).sum() + (1.0 - (1.0 - p0) ** n))


@dataclass(frozen=True)
class SparsePlan:
    """A sparse run's plan; the attributes shared with `MemoryPlan` mean the same."""

    budget: int
    chunk: int  # devices per local_update_sparse call (== cohort: unchunked)
    cohort: int
    ram_estimate: int
    unchunked_estimate: int
    baseline: int
    rounds: int
    state: StateShape
    private_on_disk: bool = False
    disk_estimate: int = 0

    @property
    def chunked(self) -> bool:
        return self.chunk < self.cohort

    def state_curve(self) -> list[tuple[int, int]]:
        """(rounds, expected state bytes) at 1, 2, 5, 10, 20, 50, ... and the last round."""
        marks = [r for r in _marks(self.rounds) if r < self.rounds] + [self.rounds]
        return [(r, self.state.state_bytes(r)) for r in marks]

    def describe(self) -> str:
        """One line for the log."""
        curve = ", ".join(f"{gib(b)} after {r}" for r, b in self.state_curve()[-2:])
        text = (
            f"memory: estimated peak {gib(self.ram_estimate)} of a {gib(self.budget)} budget "
            f"({gib(self.baseline)} resident now); sparse private state (D89): {curve} rounds; "
        )
        return text + (
            f"training {self.chunk} of {self.cohort} devices at a time" if self.chunked else "training the cohort at once"
        )

    def table(self) -> str:
        """The private state's expected bytes as a function of rounds (`--plan-only`)."""
        lines = ["rounds  private state (expected bytes)"]
        lines += [f"{r:>6}  {b:>14,d}  ({gib(b)})" for r, b in self.state_curve()]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self) | {"chunked": self.chunked, "sparse": True}
        out["state"] = asdict(self.state)
        out["state_bytes_expected"] = self.state.state_bytes(self.rounds)
        return out


def _marks(last: int) -> list[int]:
    out, r = [], 1
    while r < last:
        out += [m for m in (r, 2 * r, 5 * r) if m < last]
        r *= 10
    return out


@dataclass(frozen=True)
class SparseWork:
    """The sizes of a sparse run that are not the state's."""

    baseline: int  # resident bytes when planning
    global_bytes: int
    update_dim: int
    train_per_device: int  # local_update_sparse bytes per device (average over the population)
    train_max_device: int  # and for the largest device
    update_rows_per_device: float  # bytes of one device's update as rows (average)
    eval_per_device: int
    keep_updates: bool  # the float Gaussian or a hybrid round, or SecAgg with ranks: the whole dense table
    secagg: bool
    stream_bytes: int = 0  # a sum fed as the chunks train (models.sim.aggregation.stream_working_bytes)


def plan_sparse(
    state: StateShape, work: SparseWork, *, rounds: int, budget: int, chunk: int | None
) -> SparsePlan:
    """The plan within `budget` bytes, or MemoryBudgetError (see the module doc)."""
    if budget <= 0:
        raise MemoryBudgetError(f"--memory-gb must be > 0, got {budget / 1024**3:g}")
    if chunk is not None and chunk < 1:
        raise MemoryBudgetError(f"--cohort-chunk must be >= 1, got {chunk}")
    cohort = state.cohort
    fixed = work.baseline + state.state_bytes(rounds) + 4 * work.global_bytes
    if not work.keep_updates:
        agg = 8 * work.update_dim + work.stream_bytes
    else:
        rows = int(cohort * work.update_rows_per_device)
        # DP and SecAgg aggregate the cohort's dense table (sparse_aggregation.py)
        agg = rows + cohort * work.update_dim * (8 + (24 if work.secagg else 0))
    evaluation = EVAL_BATCH * work.eval_per_device

    def ram(c: int) -> int:
        return fixed + max(agg + work.train_max_device + c * work.train_per_device, evaluation)

    if chunk is not None:
        size = min(chunk, cohort)
    else:  # the most that fits, and at most CALL_BYTES of training tensors per call
        free = min(budget - fixed - agg, CALL_BYTES) - work.train_max_device
        size = cohort if work.train_per_device == 0 else max(1, min(cohort, free // work.train_per_device))
        size = -(-cohort // -(-cohort // size))  # as many calls, of even sizes
    if size < 1 or ram(size) > budget:
        raise MemoryBudgetError(
            f"this simulation needs about {gib(ram(max(size, 1)))} of memory with its private state kept "
            f"sparsely ({gib(state.state_bytes(rounds))} of it after {rounds} rounds), more than the budget "
            f"--memory-gb {budget / 1024**3:.2f}. Raise --memory-gb, train fewer devices per round "
            "(--clients-per-round) or a smaller model"
        )
    return SparsePlan(
        budget=budget, chunk=size, cohort=cohort, ram_estimate=ram(size),
        unchunked_estimate=ram(cohort), baseline=work.baseline, rounds=rounds, state=state,
    )  # fmt: skip
