"""`fedmask simulate --secagg --group-size G`: the secure sum in groups (D87),
device-side DP calibrated to the group, and the privacy ledger per group."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import models.privacy as privacy
from models.data.synthetic import synthetic
from models.privacy import composed_epsilon, epsilon
from models.sim.config import DPSettings
from models.sim.dp_groups import PrivacyLedger, privatize_in_groups
from models.sim.engine import SimulationConfig, SimulationConfigError, simulate


@pytest.fixture(scope="module")
def x() -> Any:
    return synthetic(120, 260, seed=5)


def run(x: Any, **kw: Any) -> dict[str, Any]:
    kw.setdefault("rounds", 2)
    kw.setdefault("model", "fedmf")
    kw.setdefault("params", {"k": 4})
    kw.setdefault("clients_per_round", 24)
    return simulate(SimulationConfig(**kw), interactions=x)


def test_groups_leave_the_model_unchanged_without_dp(x: Any) -> None:
    """One encoding for the cohort and each device rounding with its cohort
    position: the groups' total is the one-group sum bit for bit, so the
    model and every metric are the same."""
    one = run(x, secagg=True)
    four = run(x, secagg=True, secagg_group_size=6)
    assert all(r["secagg_groups"] == 1 for r in one["rounds"])
    for rec in four["rounds"]:
        assert rec["secagg_groups"] == 4 and rec["secagg_group_sizes"] == [6, 6, 6, 6]
        assert rec["secagg_exact"] and rec["secagg_counted"] == 24
    assert [r["val"] for r in four["rounds"]] == [r["val"] for r in one["rounds"]]
    assert four["test"] == one["test"]
    # a cohort below 2G is one group: the same run as the default
    below = run(x, secagg=True, secagg_group_size=13)
    assert all(r["secagg_groups"] == 1 for r in below["rounds"]) and below["test"] == one["test"]


def test_distributed_noise_is_sized_for_the_group_and_the_ledger_keeps_each_group(
    x: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[int, float]] = []
    real = privacy.privatize

    def spy(updates: torch.Tensor, *, clip: float, noise_multiplier: float,
            generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        seen.append((updates.shape[0], noise_multiplier))
        return real(updates, clip=clip, noise_multiplier=noise_multiplier, generator=generator)

    monkeypatch.setattr(privacy, "privatize", spy)
    dp = {"dp_noise": 1.0, "dp_clip": 0.1, "dp_mode": "distributed", "secagg": True, "dp_mechanism": "gaussian-float"}
    grouped = run(x, secagg_group_size=6, **dp)
    # round 0: each device noised on its own (D106), its share sized for its group of 6
    assert [n for n, _ in seen[:24]] == [1] * 24
    assert [z for _, z in seen[:24]] == pytest.approx([1 / math.sqrt(6)] * 24)
    for rec in grouped["rounds"]:
        entry = rec["dp"]
        assert [g["size"] for g in entry["groups"]] == [6, 6, 6, 6]
        assert all(g["noise_multiplier"] == 1.0 for g in entry["groups"]) and entry["noise_multiplier"] == 1.0
        # no amplification by sampling in the primary figure (the cohort is a fixed-size draw)
        assert entry["epsilon_round"] == pytest.approx(epsilon(noise_multiplier=1.0, sampling_rate=1.0, rounds=1))
        # the cost: 4 groups, each sum with N(0, (z tau)^2): the model's sum carries z * sqrt(4)
        assert entry["sum_noise_multiplier_expected"] == 2.0
        assert entry["sum_noise_multiplier_measured"] == pytest.approx(2.0, rel=0.1)
    assert grouped["epsilon"] == epsilon(noise_multiplier=1.0, sampling_rate=1.0, rounds=2)
    assert grouped["epsilon_poisson_amplified"] == epsilon(noise_multiplier=1.0, sampling_rate=0.2, rounds=2)
    seen.clear()
    single = run(x, **dp)
    assert seen[0][0] == 1 and [z for _, z in seen[:24]] == pytest.approx([1 / math.sqrt(24)] * 24)
    assert single["rounds"][0]["dp"]["sum_noise_multiplier_measured"] == pytest.approx(1.0, rel=0.1)
    assert single["epsilon"] == grouped["epsilon"]  # the same epsilon, the noise of 4 sums


def test_local_noise_ignores_the_groups() -> None:
    dp = DPSettings(noise=1.0, clip=1.0, delta=1e-5, accountant="rdp", mode="local", mechanism="gaussian-float")
    upd = torch.zeros(8, 500)
    noisy, _, entry = privatize_in_groups(upd, dp=dp, groups=((0, 1, 2, 3), (4, 5, 6, 7)),
                                          generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert entry["noise_multiplier"] == 1.0 and entry["sum_noise_multiplier_expected"] == pytest.approx(math.sqrt(8))
    assert float(noisy.std()) == pytest.approx(1.0, rel=0.05)


def test_a_round_is_priced_at_its_worst_group_and_rounds_compose() -> None:
    dp = DPSettings(noise=1.0, clip=0.1, delta=1e-5, accountant="rdp", mode="distributed",
                    mechanism="gaussian-float")
    ledger = PrivacyLedger(dp, sampling_rate=0.5)
    a = ledger.add({"mode": "distributed", "groups": [], "noise_multiplier": 1.0})
    b = ledger.add({"mode": "distributed", "groups": [], "noise_multiplier": 0.7})  # a group that lost devices
    c = ledger.add(None)  # no entry: the configured multiplier
    assert a["epsilon_round"] == c["epsilon_round"] < b["epsilon_round"]
    assert b["epsilon_round"] == pytest.approx(epsilon(noise_multiplier=0.7, sampling_rate=1.0, rounds=1))
    assert ledger.epsilon() == composed_epsilon([(1.0, 1.0), (0.7, 1.0), (1.0, 1.0)])
    assert ledger.epsilon_poisson_amplified() == composed_epsilon([(1.0, 0.5), (0.7, 0.5), (1.0, 0.5)])
    with pytest.raises(ValueError, match="exactly once"):
        privatize_in_groups(torch.zeros(3, 2), dp=dp, groups=((0, 1),), generator=torch.Generator())


def test_group_size_needs_secagg_and_two_devices(x: Any) -> None:
    with pytest.raises(SimulationConfigError, match="needs --secagg"):
        SimulationConfig(model="fedmf", secagg_group_size=10)
    with pytest.raises(SimulationConfigError, match=">= 2"):
        SimulationConfig(model="fedmf", secagg=True, secagg_group_size=1)


def test_the_cli_passes_group_size(tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from fedmask.cli import app

    res = CliRunner().invoke(app, ["simulate", "--help"], terminal_width=200)
    assert res.exit_code == 0 and "--group-size" in res.output
    bad = CliRunner().invoke(app, ["simulate", "-m", "fedmf", "-o", str(tmp_path), "--group-size", "10"])
    assert bad.exit_code != 0 and "needs --secagg" in bad.output
