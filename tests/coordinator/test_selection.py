"""Cohort selection: seeded, uniform, minimum, no consecutive participation."""

from __future__ import annotations

import random
from collections import Counter

from coordinator.selection import eligible_devices, select_cohort


def test_seeded_and_order_independent():
    a = select_cohort([5, 1, 9, 3, 7, 2], target=3, minimum=2, rng=random.Random(4))
    b = select_cohort([9, 7, 5, 3, 2, 1], target=3, minimum=2, rng=random.Random(4))
    assert a is not None and a == b and a == sorted(a) and len(a) == 3


def test_minimum_and_target():
    assert select_cohort([1, 2], target=5, minimum=3, rng=random.Random(0)) is None
    assert select_cohort([1, 2, 3], target=5, minimum=3, rng=random.Random(0)) == [1, 2, 3]


def test_roughly_uniform():
    counts: Counter[int] = Counter()
    rng = random.Random(1)
    for _ in range(2000):
        cohort = select_cohort(range(10), target=3, minimum=1, rng=rng)
        assert cohort is not None
        counts.update(cohort)
    assert all(500 < counts[i] < 700 for i in range(10))  # expected 600 each


def test_no_two_consecutive_rounds_by_default():
    prev = {1, 2}
    assert eligible_devices([1, 2, 3, 4], previous_contributors=prev) == [3, 4]
    assert eligible_devices([1, 2, 3, 4], previous_contributors=prev, allow_consecutive=True) == [1, 2, 3, 4]
    assert eligible_devices([1, 2, 3, 4], busy=[3]) == [1, 2, 4]
