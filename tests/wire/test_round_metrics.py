"""Round metrics as limbs of the masked input (wire/round_metrics.py, D35)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from secagg.encoding import FixedPointEncoding
from wire import WireError
from wire.round_metrics import MAX_METRICS, REAL_UNIT, SLOTS, MetricLayout, MetricRangeError

ENC_1000 = FixedPointEncoding.for_cohort(1000, clip=1.0)
IMPLICIT = ("devices", "examples", "update_norm", "clipped", "val_sampled_hits@10", "val_sampled_ndcg@10",
            "val_sampled_count")
EXPLICIT = ("devices", "examples", "update_norm", "clipped", "val_sse", "val_sae", "val_rating_count")


def test_layouts_are_small_at_the_largest_cohorts() -> None:
    assert MetricLayout.for_round(IMPLICIT, ENC_1000).coordinates == 10
    assert MetricLayout.for_round(EXPLICIT, ENC_1000).coordinates == 12
    assert MetricLayout.for_round((), ENC_1000).coordinates == 0


@pytest.mark.parametrize("names", [("nope",), ("devices", "devices"), tuple(SLOTS)[:1] * (MAX_METRICS + 1)])
def test_unknown_repeated_or_too_many_names_are_refused(names: tuple[str, ...]) -> None:
    with pytest.raises(WireError):
        MetricLayout.for_round(names, ENC_1000)


def test_totals_are_exact_for_counts_and_within_the_stated_precision_for_real_sums() -> None:
    layout = MetricLayout.for_round(EXPLICIT, ENC_1000)
    rng = np.random.default_rng(3)
    devices = [{"devices": 1, "examples": int(rng.integers(0, 10**7)), "update_norm": float(rng.uniform(0, 1e3)),
                "clipped": int(rng.integers(0, 2)), "val_sse": float(rng.uniform(0, 400)),
                "val_sae": float(rng.uniform(0, 40)), "val_rating_count": int(rng.integers(1, 40))}
               for _ in range(1000)]
    total = np.stack([layout.encode(d) for d in devices]).sum(axis=0, dtype=np.uint64)
    assert int(total.max()) < 2**32
    sums, counts = layout.decode(total.astype(np.uint32), 1000)
    for name in ("devices", "examples", "clipped", "val_rating_count"):
        assert counts[name] == sum(d[name] for d in devices)
    for name in ("update_norm", "val_sse", "val_sae"):
        assert math.isclose(sums[name], sum(d[name] for d in devices), rel_tol=0, abs_tol=1000 * REAL_UNIT / 2 + 1e-6)


def test_a_device_clamps_its_values_to_its_slot() -> None:
    layout = MetricLayout.for_round(("devices", "update_norm", "val_sampled_count"), ENC_1000)
    limbs = layout.encode({"devices": 1, "update_norm": 1e300, "val_sampled_count": -4})
    sums, counts = layout.decode(limbs, 1)
    assert sums["update_norm"] == pytest.approx(SLOTS["update_norm"].max_value)
    assert counts == {"devices": 1, "val_sampled_count": 0}
    sums, counts = layout.decode(layout.encode({"update_norm": float("nan")}), 1)
    assert sums["update_norm"] == 0.0 and counts["devices"] == 0  # a missing value is 0


def test_out_of_range_limbs_are_reported() -> None:
    layout = MetricLayout.for_round(IMPLICIT, ENC_1000)
    bad = np.full(layout.coordinates, 0xFFFFFFFF, dtype=np.uint32)
    with pytest.raises(MetricRangeError):
        layout.decode(bad, 3)
