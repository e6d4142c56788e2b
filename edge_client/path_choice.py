"""Which path a device's update takes in a FedMMF hybrid round (pure; D64).

A RoundTask with the `unprotected_plaintext_j_bound` hyper-parameter lets a
device send its update in PLAINTEXT when its own privacy indicator J (FedMMF,
Eq. 15: the mean squared residual of its personalised mask on its training
ratings) is small. The device decides alone, on its own state:

    plaintext  iff  J <= coordinator's bound  and  J <= this client's own cap

The client's cap is `fedmask client --unprotected-plaintext-j-bound`; a
client without it never sends plaintext, whatever the coordinator asks (a
coordinator could otherwise set an unbounded J bound and collect every
update in the clear). A missing or non-finite J, or a malformed bound in
the task, means secure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from wire.protocol import HYBRID_J_BOUND_HYPERPARAMETER


def coordinator_bound(hyperparameters: Mapping[str, Any]) -> float | None:
    """The task's J bound, or None when absent or not a finite number >= 0."""
    b = hyperparameters.get(HYBRID_J_BOUND_HYPERPARAMETER)
    if isinstance(b, bool) or not isinstance(b, int | float) or not math.isfinite(b) or b < 0:
        return None
    return float(b)


def plaintext_rows(J: Sequence[float] | np.ndarray | None, n: int, *, coordinator: float | None, own: float | None) -> list[bool]:
    """For each of the batch's `n` rows: True when that device sends its
    update in plaintext (module doc)."""
    if J is None or coordinator is None or own is None:
        return [False] * n
    if len(J) != n:
        raise ValueError(f"{len(J)} privacy indicators for {n} devices")
    bound = min(coordinator, own)
    return [math.isfinite(float(j)) and float(j) <= bound for j in J]


__all__ = ["coordinator_bound", "plaintext_rows"]
