"""Which devices each rank of a distributed simulation owns, and its part of a
round's cohort (pure; D93).

- `shard_bounds(weights, world)`: the population (rows 0..n-1, sorted by
  user id) is cut into `world` consecutive runs, balanced by the devices'
  training cost (their training interactions plus one, the fixed cost of a
  device), each run non-empty. Rank r owns rows bounds[r]..bounds[r+1]-1:
  their data and their private state, nothing else.
- `Shard.share(rows)`: a round's cohort (the sorted population rows every
  rank draws from the same seeded stream; None: everyone) seen from one
  rank: the local rows it trains, their cohort positions (a device's index
  in the sorted cohort: the same on every rank, and the same as in a
  single-process run, so the secure sum's rounding keys do not depend on
  the number of ranks) and how many cohort devices every rank holds.

Consecutive runs keep a rank's cohort positions consecutive, so the ranks'
parts of a round are the cohort's positions in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from models.data.types import ExplicitSplit, ImplicitSplit


def shard_bounds(weights: np.ndarray, world: int) -> tuple[int, ...]:
    """world+1 increasing boundaries cutting rows 0..n-1 into `world` non-empty
    consecutive runs of about equal total weight (ValueError when n < world)."""
    n = len(weights)
    if world < 1 or n < world:
        raise ValueError(f"{n} devices cannot be shared by {world} ranks (each rank needs at least one)")
    cum = np.cumsum(np.asarray(weights, dtype=np.float64))
    total = float(cum[-1]) if n else 0.0
    cuts = [0]
    for r in range(1, world):
        c = int(np.searchsorted(cum, total * r / world, side="left")) + 1
        # at least one row for this rank and for each rank after it
        cuts.append(min(max(c, cuts[-1] + 1), n - (world - r)))
    cuts.append(n)
    return tuple(cuts)


@dataclass(frozen=True)
class CohortShare:
    """One rank's part of a round's cohort."""

    rows: torch.Tensor | None  # local rows to train (None: all of the shard)
    positions: np.ndarray  # their positions in the sorted cohort (int64)
    counts: tuple[int, ...]  # cohort devices per rank
    cohort: int  # the cohort's size

    @property
    def count(self) -> int:
        return int(len(self.positions))


@dataclass(frozen=True)
class Shard:
    """Rank `rank` of `world`: population rows bounds[rank]..bounds[rank+1]-1."""

    rank: int
    world: int
    bounds: tuple[int, ...]

    @classmethod
    def whole(cls, n: int) -> Shard:
        """The single-process shard: everyone."""
        return cls(0, 1, (0, n))

    @property
    def lo(self) -> int:
        return self.bounds[self.rank]

    @property
    def hi(self) -> int:
        return self.bounds[self.rank + 1]

    @property
    def size(self) -> int:
        return self.hi - self.lo

    def share(self, rows: torch.Tensor | None) -> CohortShare:
        """This rank's part of the cohort `rows` (sorted population rows; None: every device)."""
        b = np.asarray(self.bounds, dtype=np.int64)
        if rows is None:
            sizes = tuple(int(x) for x in np.diff(b))
            return CohortShare(None, np.arange(self.lo, self.hi, dtype=np.int64), sizes, int(b[-1]))
        r = rows.detach().cpu().numpy().astype(np.int64)
        edges = np.searchsorted(r, b, side="left")  # cohort positions where each rank's rows begin
        counts = tuple(int(x) for x in np.diff(edges))
        first, last = int(edges[self.rank]), int(edges[self.rank + 1])
        local = torch.as_tensor(r[first:last] - self.lo, dtype=torch.int64, device=rows.device)
        return CohortShare(local, np.arange(first, last, dtype=np.int64), counts, len(r))


def device_costs(split: ImplicitSplit | ExplicitSplit, population: np.ndarray) -> np.ndarray:
    """Each device's weight for `shard_bounds`: its training interactions plus one."""
    if isinstance(split, ImplicitSplit):
        per_user = np.diff(split.train_indptr)
    else:
        per_user = np.bincount(split.train_user, minlength=split.n_users)
    return per_user[population].astype(np.float64) + 1.0


def shard_of(split: ImplicitSplit | ExplicitSplit, population: np.ndarray, rank: int, world: int) -> Shard:
    """Rank `rank`'s shard of `population` among `world` ranks (ValueError when too few devices)."""
    return Shard(rank, world, shard_bounds(device_costs(split, population), world))
