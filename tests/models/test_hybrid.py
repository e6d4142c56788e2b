"""FedMMF hybrid rounds in the simulator (models/sim/hybrid.py, the engine's
--plaintext-j-bound): the path choice and the plaintext + secure sum."""

from __future__ import annotations

import math

import pytest
import torch

from models.sim.engine import SimulationConfig, SimulationConfigError, simulate
from models.sim.hybrid import SECURE_FLOOR, hybrid_sum, plaintext_choice


def test_path_choice_is_j_at_most_the_bound_and_nan_stays_secure():
    J = torch.tensor([0.1, 0.5, 0.50001, float("nan"), 2.0])
    assert plaintext_choice(J, 0.5).tolist() == [True, True, False, False, False]
    assert plaintext_choice(J, None).tolist() == [False] * 5
    with pytest.raises(ValueError):
        plaintext_choice(J, -1.0)
    with pytest.raises(ValueError):
        plaintext_choice(J, math.inf)


def test_hybrid_sum_adds_the_plaintext_rows_to_the_secure_sum():
    g = torch.Generator().manual_seed(0)
    upd = torch.randn(7, 5, generator=g)
    plain = torch.tensor([True, False, True, False, False, False, True])
    seen = []

    def secure(rows):
        seen.append(rows.shape[0])
        return rows.sum(0) + 0.0

    h = hybrid_sum(upd, plain, secure)
    assert seen == [4] and (h.plaintext, h.secure_chosen, h.secure_counted, h.counted) == (3, 4, 4, 7)
    assert torch.allclose(h.total, upd.sum(0), atol=1e-6)
    mean = h.mean()
    assert mean is not None and torch.allclose(mean, upd.mean(0), atol=1e-6)


def test_fewer_secure_devices_than_the_floor_sit_out():
    upd = torch.arange(12.0).reshape(4, 3)
    plain = torch.tensor([True, True, False, False])  # 2 secure < SECURE_FLOOR
    assert SECURE_FLOOR == 3
    h = hybrid_sum(upd, plain, lambda rows: pytest.fail("the secure part must not run"))
    assert (h.plaintext, h.secure_counted, h.counted) == (2, 0, 2)
    assert torch.equal(h.total, upd[:2].sum(0))
    none = hybrid_sum(upd[2:], torch.tensor([False, False]), lambda rows: rows.sum(0))
    assert none.counted == 0 and none.mean() is None


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
