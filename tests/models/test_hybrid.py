"""FedMMF hybrid rounds in the simulator (models/sim/hybrid.py, the engine's
--plaintext-j-bound): the path choice, and the plaintext + secure sum fed
in pieces (models/sim/hybrid_stream.py, D107)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from models.sim.engine import SimulationConfig, SimulationConfigError, simulate
from models.sim.hybrid import SECURE_FLOOR, plaintext_choice
from models.sim.hybrid_stream import HybridSplit


def test_path_choice_is_j_at_most_the_bound_and_nan_stays_secure():
    J = torch.tensor([0.1, 0.5, 0.50001, float("nan"), 2.0])
    assert plaintext_choice(J, 0.5).tolist() == [True, True, False, False, False]
    assert plaintext_choice(J, None).tolist() == [False] * 5
    with pytest.raises(ValueError):
        plaintext_choice(J, -1.0)
    with pytest.raises(ValueError):
        plaintext_choice(J, math.inf)


class SecureSpy:
    """A stand-in secure sum over n devices: its order reversed, the rows it got, their float64 sum."""

    def __init__(self, n: int) -> None:
        self.n, self.sum = n, np.zeros(0)
        self.got: list[int] = []

    def order(self) -> np.ndarray:
        return np.arange(self.n)[::-1].copy()

    def add(self, rows: torch.Tensor, positions: torch.Tensor) -> None:
        self.got.extend(positions.tolist())
        part = rows.double().sum(0).numpy()
        self.sum = part if not len(self.sum) else self.sum + part

    def total(self, rec: dict) -> np.ndarray:
        rec["secure_spy"] = True
        return self.sum

    @property
    def counted(self) -> int:
        return self.n


@pytest.mark.parametrize("cuts", [[], [1], [2, 5], [1, 2, 3, 4, 5, 6]])
def test_the_split_adds_the_plaintext_rows_to_the_secure_sum(cuts: list[int]) -> None:
    """Fed in any pieces of its order: plaintext devices first, then the secure
    ones in the secure sum's order, numbered among the secure devices."""
    upd = torch.randn(7, 5, generator=torch.Generator().manual_seed(0))
    plain = np.array([True, False, True, False, False, False, True])
    spy = SecureSpy(4)
    split = HybridSplit(plain, 5, secure=spy, count_secure=True)
    order = split.order()
    assert order.tolist() == [0, 2, 6, 5, 4, 3, 1]  # the secure devices 1, 3, 4, 5 are numbered 0..3
    for a, b in zip([0, *cuts], [*cuts, 7], strict=True):
        split.add(upd[torch.as_tensor(order[a:b])], order[a:b])
    rec: dict = {}
    mean = split.mean(rec)
    assert spy.got == [3, 2, 1, 0] and rec["secure_spy"]
    assert (rec["plaintext_devices"], rec["secure_devices_chosen"], rec["secure_devices_counted"]) == (3, 4, 4)
    assert split.counted == 7 and mean is not None and torch.allclose(mean, upd.mean(0), atol=1e-6)
    with pytest.raises(ValueError, match="round's order"):
        HybridSplit(plain, 5, secure=SecureSpy(4), count_secure=True).add(upd[:2], np.array([0, 1]))


def test_fewer_secure_devices_than_the_floor_sit_out():
    upd = torch.arange(12.0).reshape(4, 3)
    plain = np.array([True, True, False, False])  # 2 secure < SECURE_FLOOR
    assert SECURE_FLOOR == 3
    split = HybridSplit(plain, 3, secure=None, count_secure=False)
    split.add(upd[torch.as_tensor(split.order())], split.order())
    rec: dict = {}
    mean = split.mean(rec)
    assert (rec["plaintext_devices"], rec["secure_devices_counted"], split.counted) == (2, 0, 2)
    assert mean is not None and torch.equal(mean, upd[:2].mean(0))  # the secure devices' updates never count
    none = HybridSplit(np.array([False, False]), 3, secure=None, count_secure=False)
    none.add(upd[2:], np.array([0, 1]))
    assert none.counted == 0 and none.mean({}) is None


def test_the_bound_is_refused_for_other_models_and_distributed_noise():
    with pytest.raises(SimulationConfigError, match="fedmmf"):
        SimulationConfig(model="fedmf", explicit=True, plaintext_j_bound=0.5)
    with pytest.raises(SimulationConfigError, match="distributed"):
        SimulationConfig(model="fedmmf", plaintext_j_bound=0.5, secagg=True, dp_noise=1.0, dp_clip=0.1,
                         dp_mode="distributed")
    with pytest.raises(SimulationConfigError, match="finite"):
        SimulationConfig(model="fedmmf", plaintext_j_bound=-0.1)


@pytest.mark.parametrize("secagg", [False, True])
def test_a_hybrid_simulation_records_the_paths_and_trains_the_same_sum(secagg):
    kw = dict(model="fedmmf", dataset="synthetic", rounds=2, threads=1, secagg=secagg,
              params={"order": "one"}, users=tuple(range(1, 31)))  # 30 devices keep the SecAgg runs short
    base = simulate(SimulationConfig(**kw))
    hyb = simulate(SimulationConfig(**kw, plaintext_j_bound=1e9))  # every device qualifies
    half = simulate(SimulationConfig(**kw, plaintext_j_bound=_median_j(base)))
    for rec in hyb["rounds"]:
        assert rec["plaintext_devices"] == hyb["cohort_size"] and rec["secure_devices_counted"] == 0
    assert hyb["hybrid"]["plaintext_share"] == 1.0
    assert 0.0 < half["hybrid"]["plaintext_share"] < 1.0
    for rec in half["rounds"]:
        assert rec["plaintext_devices"] + rec["secure_devices_counted"] == half["cohort_size"]
    # the same devices' updates are summed, whatever the path: the model is the same up to
    # the secure part's fixed-point rounding
    tol = 1e-3 if secagg else 1e-5
    assert abs(half["test"]["rmse"] - base["test"]["rmse"]) < tol
    assert abs(hyb["test"]["rmse"] - base["test"]["rmse"]) < tol


def _median_j(results):
    return results["summary"]["privacy_J_median"]
