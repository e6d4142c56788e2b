"""SecAggConfig: the policies of create() and the validation of settings."""

from __future__ import annotations

from typing import Any

import pytest

from secagg.config import SecAggConfig
from secagg.encoding import FixedPointEncoding
from secagg.errors import SecAggConfigError, EncodingRangeError


def make(**kw) -> SecAggConfig:
    base: dict[str, Any] = {"num_clients": 20, "vector_length": 8, "session_id": b"s"}
    base.update(kw)
    return SecAggConfig.create(**base)


def test_complete_graph_defaults() -> None:
    c = make()
    assert c.is_complete_graph and c.degree == 19 and c.threshold == 11
    assert make(active_adversary=True).threshold == 14  # floor(2n/3) + 1


def test_explicit_degree_and_threshold() -> None:
    c = make(neighbors=6)
    assert (c.degree, c.threshold) == (6, 4)
    assert make(neighbors=6, threshold=7).threshold == 7
    assert make(neighbors=50).is_complete_graph


def test_auto_uses_the_formula() -> None:
    c = SecAggConfig.create(num_clients=1000, vector_length=4, session_id=b"s", neighbors="auto", expected_dropout=0.05)
    assert (c.degree, c.threshold) == (30, 18)


@pytest.mark.parametrize(
    "kw",
    [
        {"threshold": 10},  # not a majority of 20
        {"threshold": 21},
        {"neighbors": 5},  # odd Harary degree
        {"neighbors": "some"},
        {"session_id": b""},
        {"session_id": b"x" * 256},
        {"session_id": "text"},
        {"num_clients": 1},
        {"vector_length": 0},
    ],
)
def test_invalid_settings(kw) -> None:
    with pytest.raises(SecAggConfigError):
        make(**kw)


def test_encoding_is_checked() -> None:
    with pytest.raises(EncodingRangeError):
        make(precision=1e-9, clip=100.0)
    with pytest.raises(SecAggConfigError):
        SecAggConfig(20, 8, b"s", 19, 11, FixedPointEncoding.for_cohort(21, clip=1.0))


def test_graph_changes_every_round_for_harary_only() -> None:
    c = make(num_clients=30, neighbors=4)
    g0, g1 = c.graph(0), c.graph(1)
    assert any(g0.neighbors(v) != g1.neighbors(v) for v in range(30))
    assert all(c.graph(0).neighbors(v) == g0.neighbors(v) for v in range(30))
    assert make().graph(0).is_complete
