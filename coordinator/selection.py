"""Cohort selection (pure; the RNG is injected).

    eligible = available devices of live sessions that support the model,
               minus the devices of a running round (and, passed with
               them, those that already answered an unmasking request on
               this model version: spent_devices.py, D85),
               minus the previous round's contributors unless
               cohort.allow_consecutive (FedRAP: two consecutive uploads of
               one device reveal its gradient)
    cohort   = a uniform sample of min(target, |eligible|) devices,
               target = ceil(cohort.size * (1 + over_selection))
    None when fewer than `minimum` are eligible.

The returned cohort is sorted by device id; its order defines the secagg
ids (the i-th device gets secagg id i, proto secagg_id i + 1).
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable


def eligible_devices(
    available: Iterable[int], *, busy: Collection[int] = (), previous_contributors: Collection[int] = (),
    allow_consecutive: bool = False,
) -> list[int]:
    """Sorted eligible device ids (see the module doc)."""
    excluded = set(busy)
    if not allow_consecutive:
        excluded |= set(previous_contributors)
    return sorted(set(available) - excluded)


def select_cohort(eligible: Iterable[int], *, target: int, minimum: int, rng: random.Random) -> list[int] | None:
    """A uniform sample of min(target, |eligible|) ids, sorted; None if
    fewer than `minimum` are eligible. Deterministic for a seeded `rng` and
    the same eligible set (its order does not matter)."""
    if target < 1 or minimum < 1:
        raise ValueError("target and minimum must be >= 1")
    pool = sorted(set(eligible))
    if len(pool) < minimum:
        return None
    return sorted(rng.sample(pool, min(target, len(pool))))
