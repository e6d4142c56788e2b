"""Graphs and the choice of (k, t)."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest

from secagg.errors import SecAggConfigError
from secagg.graph import (
    binomial_tail_at_least,
    build_graph,
    choose_parameters,
    complete_graph,
    harary_graph,
    majority_threshold,
    parameters_hold,
    random_permutation,
)


@pytest.mark.parametrize("n,k", [(4, 2), (10, 4), (51, 12), (100, 30)])
def test_harary_is_k_regular_symmetric_and_a_relabeled_ring(n: int, k: int) -> None:
    g = harary_graph(n, k, b"\x01" * 32)
    order = random_permutation(n, b"\x01" * 32)
    assert sorted(order.tolist()) == list(range(n))
    for v in range(n):
        nb = g.neighbors(v)
        assert len(nb) == k and v not in nb
        assert all(v in g.neighbors(u) for u in nb)
        assert g.closure(v) == nb | {v}
    ring_edges = {frozenset((int(order[i]), int(order[(i + j) % n]))) for i in range(n) for j in range(1, k // 2 + 1)}
    graph_edges = {frozenset((v, u)) for v in range(n) for u in g.neighbors(v)}
    assert ring_edges == graph_edges


def test_relabeling_depends_on_the_seed_only() -> None:
    a = harary_graph(50, 6, b"\x01" * 32)
    b = harary_graph(50, 6, b"\x01" * 32)
    c = harary_graph(50, 6, b"\x02" * 32)
    assert all(a.neighbors(v) == b.neighbors(v) for v in range(50))
    assert any(a.neighbors(v) != c.neighbors(v) for v in range(50))


def test_complete_graph() -> None:
    g = complete_graph(5)
    assert g.is_complete and g.degree == 4
    assert g.neighbors(2) == {0, 1, 3, 4}
    assert build_graph(5, 4, b"").is_complete
    with pytest.raises(ValueError):
        g.neighbors(5)


@pytest.mark.parametrize("n,k", [(10, 3), (10, 9), (10, 0), (4, 4)])
def test_bad_harary_degrees(n: int, k: int) -> None:
    with pytest.raises(SecAggConfigError):
        harary_graph(n, k, b"\x00" * 32)


def test_binomial_tail_against_enumeration() -> None:
    p = Fraction(1, 7)
    for k in range(0, 7):
        for t in range(0, k + 2):
            brute = sum(
                (p ** sum(w) * (1 - p) ** (k - sum(w)) for w in itertools.product((0, 1), repeat=k) if sum(w) >= t),
                Fraction(0),
            )
            assert binomial_tail_at_least(k, p, t) == brute


@pytest.mark.parametrize(
    "n,delta,gamma,expected",
    [(1000, 0.05, 0.05, (30, 18)), (1000, 0.1, 0.05, (38, 20)), (100, 0.1, 0.05, (34, 18))],
)
def test_choose_parameters_known_values_are_minimal(n, delta, gamma, expected) -> None:
    k, t = choose_parameters(n, dropout_rate=delta, corrupt_fraction=gamma)
    assert (k, t) == expected
    assert parameters_hold(n, k, t, dropout_rate=delta, corrupt_fraction=gamma)
    assert not parameters_hold(n, k, t - 1, dropout_rate=delta, corrupt_fraction=gamma)
    assert not any(
        parameters_hold(n, k - 2, s, dropout_rate=delta, corrupt_fraction=gamma) for s in range(1, k)
    )
    # The formula, spelled out independently with floats for the record.
    d, g = delta, gamma
    corr = n * sum(math.comb(k, i) * (1 - d) ** i * d ** (k - i) for i in range(t))
    sec = n * sum(math.comb(k, i) * g**i * (1 - g) ** (k - i) for i in range(t, k + 1))
    conn = math.comb(n, 2) * (d + g) ** k
    assert corr <= 2**-20 and sec <= 2**-40 and conn <= 2**-40 and 2 * t > k + 1


def test_small_cohorts_fall_back_to_the_complete_graph_or_refuse() -> None:
    k, t = choose_parameters(40, dropout_rate=0.01, corrupt_fraction=0.01)
    assert k <= 39
    with pytest.raises(SecAggConfigError):
        choose_parameters(5, dropout_rate=0.3, corrupt_fraction=0.3)
    with pytest.raises(SecAggConfigError):
        choose_parameters(100, dropout_rate=1.5, corrupt_fraction=0.1)


def test_majority_threshold() -> None:
    assert [majority_threshold(k) for k in (1, 2, 3, 4, 12)] == [2, 2, 3, 3, 7]
