"""Round metrics as extra coordinates of every device's masked input (D35).

Nothing per device travels in the clear: a RoundTask names the metrics it
wants (`RoundTask.metric_names`, each a slot of `SLOTS`), every device
appends its own values of them to its encoded update as integer limbs
(`secagg.integer_sums`), and the coordinator learns only their totals over
the devices counted in the unmasked sum (U3, exactly the devices whose
update is in the aggregate: a device's metrics are in the sum if and only
if its update is).

Each slot is a count (unit 1, exact) or a real sum in fixed point (unit
1e-6: a device's value is rounded to the nearest 1e-6, so a total over m
devices is within m * 5e-7 of the sum of their values). A device clamps
its value to [0, max_value] before encoding (max_value is per device and
stated in `SLOTS`: what one honest device can report where the protocol
fixes it, e.g. one held-out item per device in the sampled ranking, else a
deployment-wide bound), so an honest total never exceeds m * max_value. The
cohort size n and the round's modulus fix the limb width
(`IntegerSumEncoding.for_encoding`), so no total over any part of the
cohort can wrap; with w = 32 and n = 1,000 the limbs are 22 bits and the
largest layout (an explicit model with DP) takes 12 coordinates.

`MetricLayout.decode` gives the totals as (sums, counts) in the names of
`coordinator.metric_rules`, or raises `MetricRangeError` when a limb sum is
out of range (some device put a value outside its slot there).

What the bounds cannot do (D35): the coordinator sees only the totals, so
it checks them against m * max_value, not each device's value. A device
that writes its limbs itself moves a total anywhere inside that window
(and the rules of `coordinator.metric_rules`), e.g. the sampled hits up to
the sampled count, which is a hit rate of 1.0. A tight bound narrows the
window (no more 10^6 users from one device); only a range check of each
input inside the secure sum would bound one device's effect.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from secagg.encoding import FixedPointEncoding
from secagg.integer_sums import IntegerRangeError, IntegerSumEncoding
from wire.errors import WireError

#: A RoundTask names at most this many metrics.
MAX_METRICS = 16
#: Held-out validation items one device has in the sampled ranking protocol
#: (models/evaluation.py, the NCF protocol): a device is one user, with one
#: held-out item. The sampled hit, NDCG and user slots are bounded by it.
HELD_OUT_PER_DEVICE = 1
#: Validation ratings one device may report: a user's, or a whole
#: platform's in a cross-silo federation (D68), so no smaller bound holds
#: for every device that reports them.
MAX_VALIDATION_PER_DEVICE = 1_000_000
#: Training examples one device may report.
MAX_EXAMPLES_PER_DEVICE = 10_000_000
#: Fixed-point unit of the real-valued sums.
REAL_UNIT = 1e-6


class MetricRangeError(ValueError):
    """The decoded totals are out of range: some device's metric
    coordinates were outside their slots. Only the metrics are lost."""


@dataclass(frozen=True, slots=True)
class MetricSlot:
    """One metric: a count (exact integer) or a real sum at `REAL_UNIT`."""

    name: str
    is_count: bool
    max_value: float  # the most one device reports (clamped there)

    @property
    def unit(self) -> float:
        return 1.0 if self.is_count else REAL_UNIT

    @property
    def bound(self) -> int:
        """The most one device puts in the slot, in units."""
        return int(round(self.max_value / self.unit))

    def units(self, value: float) -> int:
        """A device's value in units: clamped to [0, max_value], rounded to
        the nearest unit (half up). NaN counts as 0."""
        if math.isnan(value):
            return 0
        v = min(max(float(value), 0.0), self.max_value)
        return min(int(math.floor(v / self.unit + 0.5)), self.bound)


def _slots(*slots: MetricSlot) -> dict[str, MetricSlot]:
    return {s.name: s for s in slots}


_V = float(MAX_VALIDATION_PER_DEVICE)

#: Every metric a round may ask for (the names of models/evaluation.py's
#: validation sums under "val_", and what training counts).
SLOTS: dict[str, MetricSlot] = _slots(
    MetricSlot("devices", True, 1),  # 1 per device: the total must equal |U3|
    MetricSlot("examples", True, MAX_EXAMPLES_PER_DEVICE),  # training positives / ratings
    MetricSlot("update_norm", False, 1e6),  # pre-clipping L2 norm of the update
    MetricSlot("clipped", True, 1),  # 1 if the device's update was clipped
    # one held-out item per device: at most 1 hit, NDCG at most 1, 1 user
    MetricSlot("val_sampled_hits@10", True, HELD_OUT_PER_DEVICE),
    MetricSlot("val_sampled_ndcg@10", False, float(HELD_OUT_PER_DEVICE)),
    MetricSlot("val_sampled_count", True, HELD_OUT_PER_DEVICE),
    MetricSlot("val_sse", False, 100.0 * _V),  # squared errors: at most RATING_SPAN^2 per rating
    MetricSlot("val_sae", False, 10.0 * _V),
    MetricSlot("val_rating_count", True, _V),
)


@dataclass(frozen=True, slots=True)
class MetricLayout:
    """The metric coordinates of one round: `names` in order, after the
    model update's coordinates."""

    names: tuple[str, ...]
    integers: IntegerSumEncoding | None  # None for an empty layout

    @classmethod
    def for_round(cls, names: Sequence[str], encoding: FixedPointEncoding) -> MetricLayout:
        """WireError for an unknown or repeated name, or too many."""
        names = tuple(names)
        if len(names) > MAX_METRICS:
            raise WireError(f"{len(names)} metrics requested, at most {MAX_METRICS}")
        if len(set(names)) != len(names):
            raise WireError("metric names repeat")
        unknown = [n for n in names if n not in SLOTS]
        if unknown:
            raise WireError(f"unknown metric names: {[n[:64] for n in unknown[:4]]}")
        return cls(names, IntegerSumEncoding.for_encoding(encoding) if names else None)

    @property
    def _bounds(self) -> list[int]:
        return [SLOTS[n].bound for n in self.names]

    @property
    def coordinates(self) -> int:
        """How many coordinates the metrics add to every masked input."""
        return 0 if self.integers is None else self.integers.coordinates(self._bounds)

    def encode(self, values: Mapping[str, float]) -> np.ndarray:
        """One device's coordinates (uint32); a name it has no value for is 0."""
        if self.integers is None:
            return np.zeros(0, dtype=np.uint32)
        units = [SLOTS[n].units(float(values.get(n, 0.0))) for n in self.names]
        return self.integers.encode(units, self._bounds)

    def decode(self, sums: np.ndarray, counted: int) -> tuple[dict[str, float], dict[str, int]]:
        """(real sums, counts) over the `counted` devices from the unmasked
        sum of the metric coordinates. MetricRangeError if out of range."""
        if self.integers is None:
            return {}, {}
        try:
            totals = self.integers.decode(sums, self._bounds, counted)
        except IntegerRangeError as exc:
            raise MetricRangeError(str(exc)) from None
        real: dict[str, float] = {}
        counts: dict[str, int] = {}
        for name, total in zip(self.names, totals, strict=True):
            slot = SLOTS[name]
            if slot.is_count:
                counts[name] = total
            else:
                real[name] = total * slot.unit
        return real, counts


EMPTY_LAYOUT = MetricLayout((), None)

__all__ = [
    "EMPTY_LAYOUT",
    "HELD_OUT_PER_DEVICE",
    "MAX_METRICS",
    "MetricLayout",
    "MetricRangeError",
    "MetricSlot",
    "REAL_UNIT",
    "SLOTS",
]
