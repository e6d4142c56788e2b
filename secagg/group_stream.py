"""A round in groups fed its inputs a piece at a time, so that no caller
holds the cohort's (n, L) table: each group's rows wait in a buffer of the
group's own size, and the group's SecAgg(+) instance runs the moment its
last member's row arrives (D100).

    stream = GroupStream(groups=groups, configs=configs, vector_length=L,
                         round_idx=r, seed=s, wire=False)
    stream.add(positions, rows)      # any pieces, any order; each position once
    out = stream.finish()            # a GroupedOutcome

Contract:
- Several groups: `finish()` equals `secagg.grouped_round.run_grouped_round`
  over the rows of every position at once (same groups, configs, round,
  seed, no dropouts), bit for bit: the same encoded and decoded sums, the
  same counted set. Each group runs `run_round` with the same rows in its
  members' order, the same seed of its own and the same rounding keys
  (seed, position), whatever order the pieces came in.
- One group: it equals `secagg.inprocess.run_round` over the whole
  cohort's rows in position order with `seed` (the in-process round of a
  cohort too small to split, as the simulator ran it before groups).
- A part of a larger cohort (`cohort_positions` given: a simulation rank's
  devices, D93): `run_grouped_round(..., positions=cohort_positions,
  first_group=first_group)` over the part's rows, bit for bit, one group
  included: the rounding keys are (seed, cohort position) and group j's
  seed is that of the cohort's group `first_group + j`.
- Inputs are floats (encoded by each device with the round's one encoding)
  or uint32 residues already encoded; all pieces of a round are one kind.
- Held at once: the rows of the groups not yet complete. A caller that
  feeds the cohort group by group (`order()`) holds at most one group's
  rows between pieces, plus the group running.
- A position given twice, outside 0..n-1, or rows of another length are
  refused (ValueError) before anything is kept; `finish()` before every
  position came is refused too.
No dropouts or refusals: a simulated round's devices all take part (the
gRPC coordinator's rounds have their own machines, `coordinator/`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np

from secagg.config import SecAggConfig
from secagg.encoding import FixedPointEncoding
from secagg.grouped_round import GroupedOutcome, check_groups, combine_groups, group_seed
from secagg.inprocess import RoundOutcome, run_round


class GroupStream:
    """One round in groups, its inputs fed in pieces (see the module doc)."""

    def __init__(self, *, groups: Sequence[Sequence[int]], configs: Sequence[SecAggConfig], vector_length: int,
                 round_idx: int = 0, seed: int = 0, wire: bool = True,
                 cohort_positions: Sequence[int] | None = None, first_group: int = 0) -> None:  # fmt: skip
        self.groups = tuple(tuple(int(p) for p in g) for g in groups)
        self.n = sum(len(g) for g in self.groups)
        self.configs = tuple(configs)
        self.length = int(vector_length)
        self.encoding: FixedPointEncoding = check_groups(self.n, self.length, self.groups, self.configs)
        # a part of a cohort keys its rounding by cohort position and runs every group as run_grouped_round does
        self.part = cohort_positions is not None
        self.keys = list(range(self.n)) if cohort_positions is None else [int(p) for p in cohort_positions]
        if len(self.keys) != self.n:
            raise ValueError(f"{len(self.keys)} cohort positions for {self.n} devices")
        self.first_group = int(first_group)
        if len(self.groups) == 1 and not self.part:  # the whole cohort, its rows in position order (run_round's ids)
            self.groups = (tuple(range(self.n)),)
        self.round_idx, self.seed, self.wire = round_idx, seed, wire
        self.group_of = np.empty(self.n, dtype=np.int64)
        self.slot = np.empty(self.n, dtype=np.int64)  # a position's row within its group's buffer
        for j, g in enumerate(self.groups):
            self.group_of[list(g)] = j
            self.slot[list(g)] = np.arange(len(g))
        self.seen = np.zeros(self.n, dtype=bool)
        self._buffers: dict[int, np.ndarray] = {}  # group -> its rows received so far (its members' order)
        self._filled = np.zeros(len(self.groups), dtype=np.int64)
        self._outcomes: list[RoundOutcome | None] = [None] * len(self.groups)
        self._dtype: np.dtype | None = None
        self.rows_held = 0
        self.peak_rows_held = 0  # the most rows buffered at once (what a memory plan must allow for)
        self.wall_s = 0.0

    def order(self) -> np.ndarray:
        """The positions group by group: feeding them in this order holds one group at a time."""
        return np.fromiter((p for g in self.groups for p in g), dtype=np.int64, count=self.n)

    def add(self, positions: Sequence[int] | np.ndarray, rows: np.ndarray) -> None:
        """Rows (b, L) of the cohort's positions `positions` (b of them)."""
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        x = np.asarray(rows)
        if x.ndim != 2 or x.shape != (len(pos), self.length):
            raise ValueError(f"expected ({len(pos)}, {self.length}) rows, got shape {x.shape}")
        if x.dtype != np.uint32 and not np.issubdtype(x.dtype, np.floating):
            raise TypeError(f"rows must be floats or uint32 residues, got {x.dtype}")
        if self._dtype is not None and x.dtype != self._dtype:
            raise TypeError(f"rows of {x.dtype} after rows of {self._dtype}: a round's inputs are one kind")
        if len(pos) and (pos.min() < 0 or pos.max() >= self.n):
            raise ValueError(f"positions must lie in 0..{self.n - 1}")
        if len(np.unique(pos)) != len(pos) or self.seen[pos].any():
            raise ValueError("a position was given twice")
        self._dtype = x.dtype
        self.seen[pos] = True
        started = time.perf_counter()
        owner = self.group_of[pos]
        for j in np.unique(owner).tolist():
            mine = np.flatnonzero(owner == j)
            buf = self._buffers.get(j)
            if buf is None:
                buf = self._buffers[j] = np.empty((len(self.groups[j]), self.length), dtype=x.dtype)
            for r in mine.tolist():  # row by row: no second copy of the piece
                buf[self.slot[pos[r]]] = x[r]
            self._filled[j] += len(mine)
            self.rows_held += len(mine)
            self.peak_rows_held = max(self.peak_rows_held, self.rows_held)
            if self._filled[j] == len(self.groups[j]):
                self._run(j)
        self.wall_s += time.perf_counter() - started

    def _run(self, j: int) -> None:
        """Group j's instance, over its buffered rows; the buffer is let go."""
        members = self.groups[j]
        buf = self._buffers.pop(j)
        self.rows_held -= len(members)
        if len(self.groups) == 1 and not self.part:  # the whole cohort: run_round's own seed and rounding keys
            out = run_round(buf, config=self.configs[0], round_idx=self.round_idx, seed=self.seed, wire=self.wire)
        else:
            out = run_round(buf, config=self.configs[j], round_idx=self.round_idx,
                            seed=group_seed(self.seed, self.first_group + j), wire=self.wire,
                            rounding_keys=[(self.seed, self.keys[p]) for p in members])  # fmt: skip
        del buf
        # keep the sums and counts, not the server's state (its per-device records)
        self._outcomes[j] = dataclasses.replace(out, server_state=None)

    def finish(self) -> GroupedOutcome:
        """The round's outcome, once every position's row came."""
        missing = int((~self.seen).sum())
        if missing:
            raise ValueError(f"{missing} of the round's {self.n} devices sent no input")
        outcomes = tuple(o for o in self._outcomes if o is not None)
        assert len(outcomes) == len(self.groups)  # every group ran when its last row came
        out = combine_groups(self.encoding, self.groups, outcomes, {})
        out.wall_s = self.wall_s
        return out


__all__ = ["GroupStream"]
