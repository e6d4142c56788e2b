"""FedMMF's hybrid round (D64) fed the cohort's updates as the chunks train
(D107), so that no round holds the cohort's (B, D) table.

A device's path is its own decision from its privacy indicator J, which is
fixed when its private state is made, so the split is known before the
round trains:

    split = HybridSplit(plain, D, secure=secure_rows, count_secure=n_secure >= SECURE_FLOOR)
    split.add(rows, positions)           # the next rows of `order()`, any pieces
    mean = split.mean(rec)               # None when nobody is counted

Contract:
- `order()`: the plaintext devices in cohort order, then the secure ones in
  the secure sum's order (`secure.order()`, its groups one after another),
  so that the secure sum holds one group's rows at a time.
- Plaintext rows are added in float64, one by one in that order. Secure rows
  go to `secure` (a `SecureStream` over the secure devices only, numbered
  0..n_secure-1 in cohort order) when they are counted, are added like the
  plaintext ones without a secure sum, and are dropped when fewer than the
  floor chose the secure path (those devices sit the round out: their
  updates never leave them, `models.sim.hybrid.SECURE_FLOOR`).
- `total(rec)` is the plaintext sum plus the counted secure sum (float64),
  with the paths' counts in `rec`; `mean` divides it by `counted`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from models.sim.row_order import SecureRows, next_slice, running_sum64


class HybridSplit:
    """One hybrid round's two paths, fed in pieces (see the module doc)."""

    def __init__(self, plain: np.ndarray, dim: int, *, secure: SecureRows | None, count_secure: bool) -> None:
        self.plain = np.asarray(plain, dtype=bool).reshape(-1)
        self.dim = dim
        self.plain_pos = np.flatnonzero(self.plain)
        self.secure_pos = np.flatnonzero(~self.plain)
        self.count_secure = count_secure
        self.secure = secure if count_secure else None
        self.local = np.full(len(self.plain), -1, dtype=np.int64)  # a secure device's number in the secure sum
        self.local[self.secure_pos] = np.arange(len(self.secure_pos))
        secure_order = self.secure.order() if self.secure is not None else np.arange(len(self.secure_pos))
        if sorted(secure_order.tolist()) != list(range(len(self.secure_pos))):
            raise ValueError(f"the secure sum's order does not list the {len(self.secure_pos)} secure devices")
        self._order = np.concatenate([self.plain_pos, self.secure_pos[secure_order]]).astype(np.int64)
        self.sum: torch.Tensor | None = None  # the plaintext rows (and, without a secure sum, the counted secure ones)
        self.done = 0
        self.device = torch.device("cpu")  # where the rows came from (the mean goes back there)

    def order(self) -> np.ndarray:
        """The order the rows come in (see the module doc)."""
        return self._order.copy()

    @property
    def counted(self) -> int:
        """The devices the round's sum counts."""
        return len(self.plain_pos) + (len(self.secure_pos) if self.count_secure else 0)

    def add(self, rows: torch.Tensor, positions: torch.Tensor | np.ndarray | None = None) -> None:
        """The next b rows (b, D) of `order()`; with `positions` (their cohort
        positions) in any order within that slice. ValueError otherwise."""
        if rows.ndim != 2 or rows.shape[1] != self.dim:
            raise ValueError(f"expected rows of length {self.dim}, got shape {tuple(rows.shape)}")
        rows, want = next_slice(self._order, self.done, rows, positions)
        self.device = rows.device
        plain = torch.as_tensor(self.plain[want], device=rows.device)
        self.sum = running_sum64(self.sum, rows[plain])
        secure = ~plain
        if self.count_secure and bool(secure.any()):
            if self.secure is not None:
                self.secure.add(rows[secure], torch.as_tensor(self.local[want[~self.plain[want]]]))
            else:
                self.sum = running_sum64(self.sum, rows[secure])
        self.done += len(want)

    def total(self, rec: dict[str, Any]) -> np.ndarray:
        """Once every device's row came: the counted sum (float64), the paths' counts in `rec`."""
        if self.done != len(self.plain):
            raise ValueError(f"the round has {len(self.plain)} devices, {self.done} were added")
        total = self.sum.detach().cpu().numpy() if self.sum is not None else np.zeros(self.dim)
        if self.secure is not None:
            total = total + self.secure.total(rec)
        rec["plaintext_devices"] = len(self.plain_pos)
        rec["secure_devices_chosen"] = len(self.secure_pos)
        rec["secure_devices_counted"] = len(self.secure_pos) if self.count_secure else 0
        return np.asarray(total, dtype=np.float64)

    def mean(self, rec: dict[str, Any]) -> torch.Tensor | None:
        """The mean over the counted devices (float32), None when none is counted."""
        total = self.total(rec)
        if not self.counted:
            return None
        return torch.as_tensor((total / self.counted).astype(np.float32), device=self.device)


__all__ = ["HybridSplit"]
