"""A client's RoundMetrics is checked against what each value means."""

from __future__ import annotations

import math

import pytest

from coordinator.metric_rules import metric_violation

HONEST_SUMS = {"update_norm": 3.2, "clipped": 1.0, "val_sampled_hits@10": 2.0, "val_sampled_ndcg@10": 1.3,
               "val_sse": 4.0, "val_sae": 3.0}
HONEST_COUNTS = {"devices": 3, "examples": 120, "val_sampled_count": 3, "val_rating_count": 5}


def test_an_honest_report_passes() -> None:
    assert metric_violation(HONEST_SUMS, HONEST_COUNTS, 3) is None
    assert metric_violation({"new_metric": 1.0}, {"devices": 1}, 1) is None  # unknown names allowed


@pytest.mark.parametrize(("sums", "counts", "needle"), [
    ({"val_sse": -50.0}, {"val_rating_count": 10}, "negative"),
    ({"update_norm": math.inf}, {}, "not finite"),
    ({"clipped": 4.0}, {}, "clipped"),
    ({"clipped": 0.5}, {}, "clipped"),
    ({"val_sampled_hits@10": 4.0}, {"val_sampled_count": 3}, "exceeds"),
    ({"val_sampled_hits@10": 1.5}, {"val_sampled_count": 3}, "whole"),
    ({"val_full_ndcg@10": 1.0}, {}, "without"),
    ({"val_sse": 1.0}, {}, "without"),
    ({"val_sse": 1e6}, {"val_rating_count": 2}, "exceeds"),
    ({}, {"devices": 7}, "devices"),
])
def test_impossible_reports_are_refused(sums: dict[str, float], counts: dict[str, int], needle: str) -> None:
    why = metric_violation(sums, {"devices": 3, **counts}, 3)
    assert why is not None and needle in why
