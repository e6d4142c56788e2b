"""A round's updates fed to a stream in a fixed order (pure helpers).

The simulator's streams (the DP sums, the secure sum, FedMMF's hybrid split)
take the cohort's rows a chunk at a time in the stream's `order()`: each
piece is the next slice of it, its rows in any order within the slice when
their cohort positions come along. `next_slice` checks a piece and puts its
rows in the order's sequence; `SecureRows` is what a stream that noises or
splits rows needs of the stream it hands them on to.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch


class SecureRows(Protocol):
    """A stream rows are handed on to (`models.sim.aggregation.SecureStream`,
    `models.sim.hybrid_stream.HybridSplit`): its order, the rows (their
    cohort positions), then the float64 sum of what it counted, its figures
    recorded in `rec`, and how many devices that sum counts."""

    def order(self) -> np.ndarray: ...

    def add(self, rows: torch.Tensor, positions: torch.Tensor) -> None: ...

    def total(self, rec: dict[str, Any]) -> np.ndarray: ...

    @property
    def counted(self) -> int: ...


def next_slice(order: np.ndarray, done: int, rows: torch.Tensor,
               positions: torch.Tensor | np.ndarray | None) -> tuple[torch.Tensor, np.ndarray]:  # fmt: skip
    """The b rows of the next slice of `order` (after `done` rows), in its
    sequence, and their positions. Without `positions` the rows are taken to
    be in that sequence. ValueError when the positions are not that slice."""
    b = int(rows.shape[0])
    if done + b > len(order):
        raise ValueError(f"more than the round's {len(order)} devices")
    want = order[done : done + b]
    if positions is None:
        return rows, want
    pos = np.asarray(positions.cpu() if isinstance(positions, torch.Tensor) else positions).reshape(-1)
    if len(pos) != b:
        raise ValueError(f"{len(pos)} positions for {b} rows")
    k = np.argsort(pos, kind="stable")  # which row holds each wanted position
    at = np.searchsorted(pos[k], want).clip(0, max(b - 1, 0))
    if b and not np.array_equal(pos[k][at], want):
        raise ValueError("rows must come in the round's order (its groups' rows, group after group)")
    idx = k[at]
    if not np.array_equal(idx, np.arange(b)):  # not already in order: a reordered copy
        rows = rows[torch.as_tensor(idx, device=rows.device)]
    return rows, want


def running_sum64(total: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    """`total` (None: nothing yet) plus the rows added one by one in float64,
    as `models.sim.aggregation.sum64` adds a whole table's: fed in pieces in
    the same order, the same sum bit for bit."""
    for row in rows:
        if total is None:
            total = row.to(torch.float64)
        else:
            total += row
    return total


__all__ = ["SecureRows", "next_slice", "running_sum64"]
