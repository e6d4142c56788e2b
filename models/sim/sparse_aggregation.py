"""One round's aggregation when the updates come as item rows (D89).

- Plain mean (no DP, no SecAgg): `RowSum` adds every device's rows into the
  float64 sum, row by row; no dense update exists. The dense path sums in
  float64 too (`RunningSum`), so the two sums agree whatever the order.
- DP or SecAgg: the cohort's dense table is formed and aggregated exactly as
  on the dense path (`aggregate_round`): the mechanism (D88) calibrates each
  share to its secure-aggregation group and the ledger prices the groups
  (D87), and the secure sum runs over every device's encoded input at once.
  Forming it a chunk at a time is left to do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from models.sim.aggregation import RunningSum, SecureAggregator, aggregate_round
from models.sim.config import SimulationConfig
from models.sparse import ItemRows


ROW_STEP = 1 << 18  # rows converted to float64 at a time


class RowSum(RunningSum):
    """The float64 sum of a round's updates, added as item rows."""

    def add_rows(self, rows: ItemRows) -> None:
        table = self.total.view(-1, rows.width) if rows.width else self.total.view(0, 0)
        for s in range(0, rows.nnz, ROW_STEP):  # bounded float64 temporaries
            table.index_add_(0, rows.items[s : s + ROW_STEP], rows.values[s : s + ROW_STEP].to(torch.float64))
        self.count += rows.n_devices


@dataclass
class SparseUpdates:
    """A round's updates kept as item rows, one `ItemRows` per trained chunk (DP, SecAgg)."""

    n_items: int
    dim: int
    parts: list[ItemRows] = field(default_factory=list)

    @property
    def count(self) -> int:
        return sum(p.n_devices for p in self.parts)

    def dense(self) -> torch.Tensor:
        """The whole cohort's (B, dim) table (for SecAgg only)."""
        return torch.cat([p.dense(self.n_items) for p in self.parts]) if self.parts else torch.zeros(0, self.dim)


def aggregate_sparse(
    upd: SparseUpdates,
    *,
    config: SimulationConfig,
    secure: SecureAggregator | None,
    dp_generator: torch.Generator,
    round_idx: int,
    rec: dict[str, Any],
) -> torch.Tensor | None:
    """The mean update of a round kept as rows (see the module doc); records what
    it did in `rec` like `aggregate_round`."""

    def no_indicator() -> torch.Tensor:
        raise RuntimeError("no privacy indicator: the hybrid round is FedMMF's, which is trained densely")

    return aggregate_round(upd.dense(), config=config, secure=secure, dp_generator=dp_generator,
                           cohort_J=no_indicator, round_idx=round_idx, rec=rec)  # fmt: skip
