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
    assert MetricLayout.for_round(IMPLICIT, ENC_1000).coordinates == 9  # 1 limb for each sampled slot
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


def test_the_sampled_slots_hold_what_one_device_reports_and_no_more() -> None:
    """One held-out item per device: a device's sampled count, hits and
    NDCG are at most 1; a device reporting more is clamped, and totals
    above the number of devices are refused."""
    assert {n: SLOTS[n].max_value for n in ("val_sampled_hits@10", "val_sampled_ndcg@10", "val_sampled_count")} == {
        "val_sampled_hits@10": 1, "val_sampled_ndcg@10": 1.0, "val_sampled_count": 1}
    layout = MetricLayout.for_round(IMPLICIT, ENC_1000)
    _, counts = layout.decode(layout.encode({"val_sampled_count": 10**6, "val_sampled_hits@10": 10**6}), 1)
    assert counts["val_sampled_count"] == counts["val_sampled_hits@10"] == 1


def test_what_one_hostile_device_can_still_do_to_the_sampled_totals() -> None:
    """D35's remaining bias, recorded: m - 1 honest devices (hit rate 0.3)
    and one device writing its own limbs. The old worst case (10^6 users,
    all hits) is out of range now; but adding hits up to the count keeps
    every total in range and every rule of coordinator.metric_rules, and
    reads as a hit rate of 1.0. The coordinator sees only totals: no bound
    per slot can stop that (a range check per input inside the secure sum
    could)."""
    from coordinator.metric_rules import metric_violation
    from edge_client.faults import forged_metric_limbs

    m = 100
    layout = MetricLayout.for_round(IMPLICIT, ENC_1000)
    honest = [layout.encode({"devices": 1, "val_sampled_count": 1, "val_sampled_hits@10": int(i < 30),
                             "val_sampled_ndcg@10": 0.5 * (i < 30)}) for i in range(m - 1)]

    def totals(hostile: dict[str, float]) -> tuple[dict[str, float], dict[str, int]]:
        limbs = [*honest, forged_metric_limbs(layout, layout.encode({"devices": 1}), hostile)]
        return layout.decode(np.stack(limbs).sum(axis=0, dtype=np.uint64).astype(np.uint32), m)

    with pytest.raises(MetricRangeError):  # the old worst case: refused
        totals({"val_sampled_count": 1e6, "val_sampled_hits@10": 1e6, "val_sampled_ndcg@10": 1e6})
    sums, counts = totals({"val_sampled_count": 1, "val_sampled_hits@10": m - 30, "val_sampled_ndcg@10": 0})
    assert metric_violation(sums, counts, m) is None
    assert counts["val_sampled_hits@10"] / counts["val_sampled_count"] == 1.0  # from 0.3: one device did it
