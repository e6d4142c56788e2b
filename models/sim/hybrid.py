"""FedMMF's hybrid rounds: which devices send their update in plaintext (pure).

The paper (Yang et al., "Practical and Secure Federated Recommendation with
Personalized Masks") lets a device whose personalised mask fits its own
ratings well, i.e. whose privacy indicator J (Eq. 15, the mean squared
residual of the mask model on the device's training ratings, in squared
rating units; `models.fedmmf`) is at most a bound, send its item-factor
update in the clear; the others join through secure aggregation. The round's
update is the sum of both parts. This is an opt-in exception to "nothing
per-device leaves a device in the clear" (docs/decisions.md D64-D66).

- `plaintext_choice(J, bound)`: the device's own decision, J <= bound (a
  NaN J never qualifies; no bound: nobody goes plaintext).
- `SECURE_FLOOR`: the fewest secure devices whose updates the simulator sums
  securely (the edge client's default --min-cohort, D31); with fewer, the
  secure devices sit the round out (their updates never leave them) and
  the round counts the plaintext devices alone. The coordinator applies the
  round's Shamir threshold instead (coordinator/hybrid.py).
- `HybridSum`: the total of a round and how many devices took each path.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

#: The fewest secure devices the simulator aggregates (the edge client's default --min-cohort).
SECURE_FLOOR = 3


def check_bound(bound: float | None) -> None:
    """A J bound is a finite number >= 0 (ValueError otherwise)."""
    if bound is not None and not (math.isfinite(bound) and bound >= 0):
        raise ValueError(f"the plaintext J bound must be a finite number >= 0, got {bound!r}")


def plaintext_choice(J: torch.Tensor, bound: float | None) -> torch.Tensor:
    """Boolean (B,): True where a device's J is at most `bound` (its update
    may go out in plaintext). None: every device stays secure."""
    if bound is None:
        return torch.zeros(J.shape, dtype=torch.bool, device=J.device)
    check_bound(bound)
    return J <= bound  # NaN compares False: a device without a valid J stays secure


@dataclass(frozen=True)
class HybridSum:
    """A hybrid round's total over the counted devices.

    `total` is the plaintext updates' sum plus the secure sum (float, (D,));
    `counted` = plaintext + secure_counted devices; `secure_counted` is 0 when
    the secure part did not run (fewer than the floor chose it)."""

    total: torch.Tensor
    plaintext: int
    secure_chosen: int
    secure_counted: int

    @property
    def counted(self) -> int:
        return self.plaintext + self.secure_counted

    def mean(self) -> torch.Tensor | None:
        """The mean over the counted devices (None when none is counted)."""
        return self.total / self.counted if self.counted else None


def hybrid_sum(
    updates: torch.Tensor,
    plaintext: torch.Tensor,
    secure_sum: Callable[[torch.Tensor], torch.Tensor],
    *,
    floor: int = SECURE_FLOOR,
) -> HybridSum:
    """Sum a round's updates (B, D): the rows with `plaintext` True in the
    clear, the others through `secure_sum` (a function of the secure rows that
    returns their sum; it is not called with fewer than `floor` rows)."""
    if plaintext.shape != updates.shape[:1]:
        raise ValueError(f"plaintext choice of shape {tuple(plaintext.shape)} for {updates.shape[0]} updates")
    n_plain = int(plaintext.sum())
    total = updates[plaintext].sum(0)
    n_sec = updates.shape[0] - n_plain
    counted_sec = 0
    if n_sec >= floor:
        total = total + secure_sum(updates[~plaintext])
        counted_sec = n_sec
    return HybridSum(total=total, plaintext=n_plain, secure_chosen=n_sec, secure_counted=counted_sec)


__all__ = ["SECURE_FLOOR", "HybridSum", "check_bound", "hybrid_sum", "plaintext_choice"]
