"""Order-free sums of updates for a distributed simulation (D93).

A float sum depends on the order of its additions, so the same cohort split
over N ranks would sum to a (slightly) different mean than over one, and a
model that amplifies tiny differences (a sampled negative that flips) would
then drift apart. Here every coordinate of every device's update is first
rounded, on its own, to the fixed-point grid 2^-EXACT_BITS (int64), and the
integers are added: integer addition is exact and associative, so the sum is
the same function of the cohort's updates however the devices are split
into ranks and chunks, and the all_reduce of the ranks' int64 sums is exact.

Range: the sum of `count` values of magnitude at most `peak` stays below
2^63 while count * peak * 2^EXACT_BITS < 2^63; a round whose cohort size
times its largest |coordinate| reaches `RANGE` (half that bound), or that
holds a NaN or an infinity, is out of range: its mean is NaN, and the run
stops there as a diverged run does. Resolution: 2^-36 (1.5e-11) per
coordinate, far below float32's resolution of the updates themselves.
"""

from __future__ import annotations

import torch

from models.sim.sparse_aggregation import RowSum
from models.sparse import ItemRows

EXACT_BITS = 36
SCALE = float(1 << EXACT_BITS)
#: a round is out of range when its cohort size times its largest |coordinate| reaches this
RANGE = float(1 << (62 - EXACT_BITS))


def fixed_point(x: torch.Tensor) -> tuple[torch.Tensor, float, int]:
    """(int64 values of x on the grid, the largest finite |x|, how many are not finite);
    a non-finite value counts as 0 in the integers (its count makes the round out of range)."""
    v = x.detach().to(torch.float64)
    finite = torch.isfinite(v)
    bad = int(v.numel() - int(finite.sum()))
    v = torch.where(finite, v, torch.zeros_like(v))
    peak = float(v.abs().max()) if v.numel() else 0.0
    q = (v * SCALE).clamp(-(2.0**62), 2.0**62).round().to(torch.int64)
    return q, peak, bad


class FixedSum(RowSum):
    """The exact int64 sum of a round's updates on the grid, added as dense
    rows (`add`) or item rows (`add_rows`); `total` is int64 here."""

    def __init__(self, dim: int, device: torch.device) -> None:
        super().__init__(dim, device)
        self.total = torch.zeros(dim, dtype=torch.int64, device=device)
        self.peak = 0.0
        self.nonfinite = 0

    def add(self, upd: torch.Tensor) -> None:
        q, peak, bad = fixed_point(upd)
        self.total += q.sum(0)
        self._note(int(upd.shape[0]), peak, bad)

    def add_rows(self, rows: ItemRows) -> None:
        table = self.total.view(-1, rows.width) if rows.width else self.total.view(0, 0)
        q, peak, bad = fixed_point(rows.values)
        table.index_add_(0, rows.items, q)
        self._note(rows.n_devices, peak, bad)

    def _note(self, devices: int, peak: float, bad: int) -> None:
        self.count += devices
        self.peak = max(self.peak, peak)
        self.nonfinite += bad

    def mean(self) -> torch.Tensor:
        return mean_of(self.total, self.count)


def mean_of(total: torch.Tensor, count: int) -> torch.Tensor:
    """The float32 mean from an exact int64 sum of `count` updates."""
    return (total.to(torch.float64) / SCALE / max(count, 1)).to(torch.float32)
