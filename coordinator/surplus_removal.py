"""The coordinator's half of removable noise (Dordis's way, D110): the
counted devices' surplus noise taken out of a completed secure sum.

When a round's secure sum completes under removable noise, its machine
(`coordinator.rounds.RoundMachine`) holds a `SurplusRemoval` instead of a
result: every component seed the secagg server rebuilt, and the exact sum.
`SurplusRemoval.run()` regenerates those components (exact discrete
Gaussian draws: s (n - t - j) of d' coordinates for s counted of n, j
dropped) and subtracts them mod 2^w, then decodes as any round does. It is
pure and touches no machine state, so the round loop runs it on a worker
thread (it takes seconds to minutes, far too long for the event loop) and
hands the result back with `RoundMachine.surplus_removed`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from coordinator.aggregate import AggregateResult, aggregate_result
from dpmech.mechanism import MechanismConfig
from dpmech.removable_encoding import RemovableNoise, remove_surplus
from secagg.config import SecAggConfig
from wire.round_metrics import MetricLayout


@dataclass(frozen=True, eq=False)
class SurplusRemoval:
    """Everything one removal needs (nothing mutable is shared)."""

    config: SecAggConfig
    metrics: MetricLayout
    mechanism: MechanismConfig
    rotation_key: bytes
    encoded_sum: np.ndarray  # uint32 (L,): the unmasked sum mod 2^32
    counted: tuple[int, ...]  # device ids, as the result lists them
    removed_seeds: Mapping[int, Mapping[int, bytes]]  # secagg id -> k -> seed

    @property
    def removable(self) -> RemovableNoise:
        return RemovableNoise.for_group(self.mechanism, self.config.num_clients, self.config.threshold)

    @property
    def regenerated(self) -> int:
        """How many components `run` regenerates."""
        return sum(len(ks) for ks in self.removed_seeds.values())

    def run(self) -> AggregateResult:
        """The round's result with the surplus removed (ValueError when the
        rebuilt seeds are not exactly the counted devices' removed
        components: no partial removal is ever released)."""
        residues = self.config.encoding.reduce(self.encoded_sum)
        if self.metrics.coordinates:
            raise ValueError("a discrete-Gaussian round carries no metric coordinates (D36)")
        released = remove_surplus(residues, len(self.counted), self.removed_seeds, self.removable, self.mechanism)
        result = aggregate_result(self.config, self.metrics, released, self.counted, self.mechanism, self.rotation_key)
        return dataclasses.replace(result, unmasked_sum=residues)
