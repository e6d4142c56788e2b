"""What a round's metric totals may say, checked against their meaning (pure).

`metric_violation(sums, counts, devices)` returns why totals over `devices`
devices are impossible, or None. The totals are decoded from the unmasked
secure sum (`wire.round_metrics`, D35), so a hostile device can have put
anything in its metric coordinates; the rules catch what is impossible for
honest devices, for the names of `wire.round_metrics.SLOTS` (the
validation sums of models/evaluation.py under a "val_" prefix). A name may
come as a count (int) or a sum (float); the rules read both:

- counts are whole numbers: `devices` equals the number of devices in the
  sum; `examples` and every `val_*_count` are at most MAX_PER_DEVICE per
  device;
- sums are finite; `update_norm`, `val_sse`, `val_sae` and every other
  sum are >= 0 (no metric the project reports can be negative);
- `clipped` is a whole number of devices in [0, devices];
- `val_<family>_hits@k` lies in [0, val_<family>_count] and is whole;
  `val_<family>_ndcg@k` in [0, val_<family>_count] (each user's NDCG is at
  most 1); a hit or NDCG sum without its count is refused;
- `val_sse` / `val_sae` need `val_rating_count` and are bounded by the
  largest error a rating can have (RATING_SPAN per rating, squared for SSE).

Names it does not know are allowed if finite and >= 0. Totals that break a
rule are dropped whole: the round commits with its metrics marked
unavailable (round_report.round_metrics; a metric never fails a commit).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

#: No device reports more than this many training examples or validation users / ratings.
MAX_PER_DEVICE = 10_000_000
#: Ratings lie on a scale no wider than this (MovieLens: 1..5).
RATING_SPAN = 10.0
#: The largest rounding of one device's real-valued metric (wire.round_metrics.REAL_UNIT / 2), doubled.
ROUNDING = 1e-6

_RANKED = re.compile(r"^val_(sampled|full|placebo)_(hits|ndcg)@(\d{1,4})$")


def metric_violation(sums: Mapping[str, float], counts: Mapping[str, int], devices: int) -> str | None:
    """Why this report is impossible, or None (see the module doc)."""
    if counts.get("devices", devices) != devices:
        return f"counts['devices'] is {counts.get('devices')} for a report of {devices} device(s)"
    for name, n in counts.items():
        if n < 0 or n > MAX_PER_DEVICE * max(devices, 1):
            return f"count {name!r} = {n} is out of range for {devices} device(s)"
    for name, v in sums.items():
        if not math.isfinite(v) or v < 0:
            return f"sum {name!r} = {v!r} is negative or not finite"
    values: dict[str, float] = {**sums, **{k: float(n) for k, n in counts.items()}}
    slack = ROUNDING * max(devices, 1)  # each device's real values are rounded to the nearest 1e-6
    clipped = values.get("clipped")
    if clipped is not None and (clipped > devices or clipped != int(clipped)):
        return f"'clipped' = {clipped!r} is not a whole number of at most {devices} device(s)"
    for name, v in values.items():
        m = _RANKED.match(name)
        if m is None:
            continue
        count_name = f"val_{m.group(1)}_count"
        if count_name not in counts:
            return f"sum {name!r} comes without {count_name!r}"
        if v > counts[count_name] + slack:
            return f"sum {name!r} = {v!r} exceeds {count_name!r} = {counts[count_name]}"
        if m.group(2) == "hits" and v != int(v):
            return f"sum {name!r} = {v!r} is not a whole number of hits"
    n_ratings = counts.get("val_rating_count")
    for name, per_rating in (("val_sse", RATING_SPAN**2), ("val_sae", RATING_SPAN)):
        if name in sums:
            if n_ratings is None:
                return f"sum {name!r} comes without 'val_rating_count'"
            if sums[name] > per_rating * n_ratings + slack:
                return f"sum {name!r} = {sums[name]!r} exceeds what {n_ratings} rating(s) can give"
    return None


__all__ = ["MAX_PER_DEVICE", "RATING_SPAN", "metric_violation"]
