"""The float Gaussian of a simulated round (`--dp-mechanism gaussian-float`:
D87's shares, an approximate epsilon, D88) fed the cohort's updates a chunk
at a time, so that a round trained in chunks never holds the (B, D) table
(D106), as `models.sim.dp_mechanism.DiscreteGaussianSum` does for the
discrete Gaussian.

    stream = FloatGaussianSum(B, D, dp=dp, groups=groups, generator=g, secure=None)
    stream.add(rows, positions)      # the next rows of `order()`, any pieces
    total, norms, entry, secured = stream.finish()

Contract:
- `order()` is the groups' rows, group after group (row order for one
  group). Each piece must be the next slice of it (its rows in any order
  within the slice, given their positions); other positions are refused.
- Each row is clipped to tau and noised on its own, in `order()`, with its
  group's multiplier (`models.sim.dp_groups.privatize_rows`): the draws are
  those of `privatize_in_groups` over the whole table, whatever the pieces.
- The noisy rows are added in float64 one by one in `order()`, continuing
  one running total: `sum64` of the whole noisy table in that order, bit for
  bit; it is the released sum without a secure sum, and the measured
  noise's base in any case. With `secure` (its order must be `order()`)
  they also go on to the round's `SecureStream`, which holds one group's
  rows, or to FedMMF's hybrid split (D107), whose sum is then released.
- `finish()` gives (the sum in float64, the pre-clipping norms in float64,
  the round's ledger entry with the measured noise multiplier, what the
  secure sum recorded), the shape of `DiscreteGaussianSum.finish`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from models.sim.config import DPSettings
from models.sim.dp_groups import device_multipliers, group_order, privatize_rows, round_entry
from models.sim.row_order import SecureRows, next_slice, running_sum64


class FloatGaussianSum:
    """One round's float-Gaussian sum, fed in pieces (see the module doc)."""

    def __init__(self, devices: int, dim: int, *, dp: DPSettings, groups: Sequence[Sequence[int]],
                 generator: torch.Generator, secure: SecureRows | None) -> None:  # fmt: skip
        self.devices, self.dim, self.dp, self.groups = devices, dim, dp, groups
        self.generator = generator
        self.multipliers = device_multipliers(dp, groups, devices)  # ValueError unless groups cover 0..B-1
        self._order = group_order(groups)
        self.secure = secure
        if secure is not None and not np.array_equal(secure.order(), self._order):
            raise ValueError("the secure sum's groups are not the round's groups")
        self.total: torch.Tensor | None = None  # the noisy rows' float64 running sum (every row)
        self.clipped_sum: torch.Tensor | None = None  # the clipped rows' (for the measured noise)
        self.norms = torch.empty(devices, dtype=torch.float64)
        self.done = 0
        self.device = torch.device("cpu")  # where the rows came from (the mean goes back there)

    def order(self) -> np.ndarray:
        """The order the rows come in: the groups' rows, group after group."""
        return self._order.copy()

    @property
    def counted(self) -> int:
        """The devices the sum counts: every one, or what the stream handed on to counts."""
        return self.devices if self.secure is None else self.secure.counted

    def add(self, rows: torch.Tensor, positions: torch.Tensor | np.ndarray | None = None) -> None:
        """The next b rows (b, D) of `order()`; with `positions` (their cohort
        positions) in any order within that slice. ValueError otherwise."""
        if rows.ndim != 2 or rows.shape[1] != self.dim:
            raise ValueError(f"expected rows of length {self.dim}, got shape {tuple(rows.shape)}")
        rows, want = next_slice(self._order, self.done, rows, positions)
        b = len(want)
        self.device = rows.device
        noisy, norms = privatize_rows(rows, self.multipliers[want], clip=self.dp.clip, generator=self.generator)
        self.norms[want] = norms.detach().to("cpu", torch.float64)
        scale = torch.clamp(self.dp.clip / norms.clamp(min=1e-12), max=1.0).to(rows.dtype)
        self.clipped_sum = running_sum64(self.clipped_sum, rows * scale.unsqueeze(1))
        self.total = running_sum64(self.total, noisy)
        if self.secure is not None:
            self.secure.add(noisy, torch.as_tensor(want))
        self.done += b

    def finish(self) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any], dict[str, Any]]:
        """Once every device's rows are in: (sum, norms, entry, secured), see the module doc."""
        if self.done != self.devices:
            raise ValueError(f"the round has {self.devices} devices, {self.done} were added")
        noisy = self.total.cpu() if self.total is not None else torch.zeros(self.dim, dtype=torch.float64)
        clipped = self.clipped_sum.cpu() if self.clipped_sum is not None else torch.zeros_like(noisy)
        entry = round_entry(self.dp, self.groups)
        # the noise the devices added, over every row (before any encoding)
        entry["sum_noise_multiplier_measured"] = (
            float((noisy - clipped).pow(2).mean().sqrt()) / self.dp.clip if self.dim else 0.0)
        secured: dict[str, Any] = {}
        total = noisy if self.secure is None else torch.as_tensor(self.secure.total(secured))
        return total, self.norms, entry, secured


__all__ = ["FloatGaussianSum"]
