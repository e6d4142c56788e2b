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

The round's sum, fed as the chunks train, is `models.sim.hybrid_stream`'s (D107).
"""

from __future__ import annotations

import math

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


__all__ = ["SECURE_FLOOR", "check_bound", "plaintext_choice"]
