"""Order-free sums of updates for a distributed simulation (D93).

A float sum depends on the order of its additions, so the same cohort split
over N ranks would sum to a (slightly) different mean than over one, and a
model that amplifies tiny differences would then drift apart. Here every
coordinate of every device's update is first rounded, on its own, to the
fixed-point grid 2^-EXACT_BITS, and the integers are added: integer addition
is exact and associative, so the sum is the same function of the cohort's
updates however the devices are split into ranks and chunks, and the
all_reduce of the ranks' integer sums is exact.

An integer q = round(v 2^48) is kept as two int64 limbs, q = hi 2^32 + lo
with 0 <= lo < 2^32, each summed on its own (a float32 v times a power of two
is exact in float64, so q is; the limbs are exact too). The lo sums stay
below 2^63 for any cohort under 2^31 devices; the hi sums while the cohort
size times the largest |coordinate| stays below 2^46 (`RANGE`, half the
bound): about 7e13, e.g. coordinates up to 5e8 for a cohort of 138,493. A
round past that, or with a NaN or an infinity, is out of range: its mean is
NaN, and the run stops there as a diverged run does. Resolution: 2^-48
(3.6e-15) per coordinate, far below float32's own.
"""

from __future__ import annotations

import torch

from models.sim.sparse_aggregation import RowSum
from models.sparse import ItemRows

EXACT_BITS = 48
_LIMB = float(1 << 32)
#: a round is out of range when its cohort size times its largest |coordinate| reaches this
RANGE = float(1 << 46)


STEP = 1 << 16  # item rows converted at a time (bounded float64 temporaries, as RowSum); dense: STEP * 32 values


def fixed_point(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float, int]:
    """x on the grid as int64 limbs (hi, lo) of round(x 2^EXACT_BITS), the
    largest finite |x|, and how many values are not finite (they count as 0
    in the limbs; their count makes the round out of range)."""
    v = x.detach().to(torch.float64, copy=True)  # its own copy: the steps below work in place
    bad = 0
    if v.numel() and not bool(torch.isfinite(v).all()):
        finite = torch.isfinite(v)
        bad = int(v.numel() - int(finite.sum()))
        v = torch.where(finite, v, torch.zeros_like(v))
    peak = float(v.abs().max()) if v.numel() else 0.0
    q = v.mul_(2.0**EXACT_BITS).round_()  # exact: a power of 2
    hi = torch.floor(q / _LIMB).clamp_(-(2.0**62), 2.0**62)
    lo = q.sub_(hi * _LIMB).clamp_(0, _LIMB - 1)  # in [0, 2^32) (0 where hi was clamped: out of range anyway)
    return hi.to(torch.int64), lo.to(torch.int64), peak, bad


class FixedSum(RowSum):
    """The exact sum of a round's updates on the grid (two int64 limbs),
    added as dense rows (`add`) or item rows (`add_rows`), STEP rows at a time."""

    def __init__(self, dim: int, device: torch.device) -> None:
        super().__init__(dim, device)
        self.hi = torch.zeros(dim, dtype=torch.int64, device=device)
        self.lo = torch.zeros(dim, dtype=torch.int64, device=device)
        self.peak = 0.0
        self.nonfinite = 0

    def add(self, upd: torch.Tensor) -> None:
        step = max(1, (STEP * 32) // max(1, int(upd[0].numel()) if upd.shape[0] else 1))
        for s in range(0, int(upd.shape[0]), step):
            hi, lo, peak, bad = fixed_point(upd[s : s + step])
            self.hi += hi.sum(0)
            self.lo += lo.sum(0)
            self._note(0, peak, bad)
        self.count += int(upd.shape[0])

    def add_rows(self, rows: ItemRows) -> None:
        hi_t = self.hi.view(-1, rows.width) if rows.width else self.hi.view(0, 0)
        lo_t = self.lo.view(-1, rows.width) if rows.width else self.lo.view(0, 0)
        for s in range(0, rows.nnz, STEP):
            hi, lo, peak, bad = fixed_point(rows.values[s : s + STEP])
            hi_t.index_add_(0, rows.items[s : s + STEP], hi)
            lo_t.index_add_(0, rows.items[s : s + STEP], lo)
            self._note(0, peak, bad)
        self.count += rows.n_devices

    def _note(self, devices: int, peak: float, bad: int) -> None:
        self.count += devices
        self.peak = max(self.peak, peak)
        self.nonfinite += bad

    def mean(self) -> torch.Tensor:
        return mean_of(self.hi, self.lo, self.count)


def mean_of(hi: torch.Tensor, lo: torch.Tensor, count: int) -> torch.Tensor:
    """The float32 mean from an exact sum's limbs over `count` updates."""
    total = hi.to(torch.float64) * 2.0 ** (32 - EXACT_BITS) + lo.to(torch.float64) * 2.0**-EXACT_BITS
    return (total / max(count, 1)).to(torch.float32)
