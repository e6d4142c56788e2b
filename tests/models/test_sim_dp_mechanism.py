"""The simulator under the discrete Gaussian (D88, models/sim/dp_mechanism.py).

Oracles: the devices' own path (`dpmech.mechanism.encode` with the exact
sampler, summed mod 2^w and decoded) for the law of what the server
decodes; the same round without SecAgg for the secure sum (bit for bit);
`dpmech.mechanism.privacy_rho` and dp_accounting for the ledger."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats

from dpmech import accounting
from dpmech.field import to_unsigned
from dpmech.mechanism import decode_sum, encode, privacy_rho
from dpmech.random_source import GeneratorBytes
from models.data.synthetic import synthetic
from models.sim.aggregation import SecureAggregator
from models.sim.config import DPSettings, SimulationConfig
from models.sim.dp_mechanism import discrete_gaussian_round, round_mechanisms, rotation_seed
from models.sim.engine import SimulationConfigError, simulate

DP = DPSettings(noise=1.0, clip=1.0, delta=1e-5, accountant="rdp", mode="distributed")
B, DIM = 6, 12  # padded to 16


def _updates(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, DIM, generator=g, dtype=torch.float64) * torch.tensor([[0.1], [0.5], [1], [2], [0.3], [4]])


def _clipped_sum(u: torch.Tensor) -> np.ndarray:
    x = u.numpy()
    return (x * np.minimum(1.0, 1.0 / np.linalg.norm(x, axis=1, keepdims=True))).sum(axis=0)


def test_through_secagg_the_round_is_the_plain_rounds_sum_bit_for_bit() -> None:
    """The residues through the in-process SecAgg (in groups, too) give the
    same decoded sum as adding them directly: the secure sum is exact mod 2^w."""
    u = torch.randn(12, DIM, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for group_size in (None, 4):
        secure = SecureAggregator(seed=3, neighbors="all", group_size=group_size)
        groups = secure.partition(12, 5)
        plain, _, entry, _ = discrete_gaussian_round(u, dp=DP, groups=groups, seed=9, round_idx=5, secure=None)
        viasa, _, again, did = discrete_gaussian_round(u, dp=DP, groups=groups, seed=9, round_idx=5, secure=secure)
        assert did["secagg_exact"] and did["secagg_groups"] == len(groups) == (1 if group_size is None else 3)
        assert torch.equal(plain, viasa) and entry["rho"] == again["rho"]


def test_the_simulated_law_matches_the_devices_exact_path() -> None:
    """What the server decodes, minus the clipped sum, drawn 300 times by the
    simulator (seeded fast sampler) and by devices encoding with the exact
    sampler: the two samples are one law (two-sample KS); the check sees a
    noise 25% larger."""
    u = _updates(0)
    groups = ((0, 1, 2, 3, 4, 5),)
    (mech,) = round_mechanisms(DP, DIM, groups)
    want = _clipped_sum(u)
    sim, exact, louder = [], [], []
    rng = np.random.default_rng(7)
    noise = GeneratorBytes(np.random.default_rng(8))
    for r in range(300):
        total, _, _, _ = discrete_gaussian_round(u, dp=DP, groups=groups, seed=11, round_idx=r, secure=None)
        sim.append(total.numpy() - want)
        key = rotation_seed(12, r)
        words = sum(to_unsigned(encode(row, mech, key, rng, noise=noise), 32).astype(np.uint64) for row in u.numpy())
        exact.append(decode_sum(np.asarray(words % (1 << 32), dtype=np.uint64), mech, key) - want)
        louder.append(exact[-1] * 1.25)
    a, b, c = (np.concatenate(v) for v in (sim, exact, louder))
    assert stats.ks_2samp(a, b).pvalue > 1e-3
    assert stats.ks_2samp(a, c).pvalue < 1e-3
    # the noise is what 6 shares of sigma^2 carry, in model units, about the multiplier z = 1 of the clip
    assert a.std() == pytest.approx(math.sqrt(B * float(mech.sigma2)) / mech.scale, rel=0.1)


def test_groups_calibrate_their_own_shares_and_the_round_costs_its_worst_group() -> None:
    groups = ((0, 1, 2), (3, 4, 5, 6), (7, 8, 9))
    configs = round_mechanisms(DP, DIM, groups)
    assert len({(c.scale, c.bits, c.devices) for c in configs}) == 1  # one encoding per round (D87)
    assert configs[0].sigma2 == configs[2].sigma2 > configs[1].sigma2
    u = torch.randn(10, DIM, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    _, _, entry, _ = discrete_gaussian_round(u, dp=DP, groups=groups, seed=1, round_idx=0, secure=None)
    rhos = [privacy_rho(c, len(g)) for c, g in zip(configs, groups, strict=True)]
    assert [g["rho"] for g in entry["groups"]] == rhos and entry["rho"] == max(rhos)
    assert all(g["noise_multiplier"] >= 1.0 - 1e-9 for g in entry["groups"])  # each group's sum carries z
    local = DPSettings(noise=1.0, clip=1.0, delta=1e-5, accountant="rdp", mode="local")
    _, _, own, _ = discrete_gaussian_round(u, dp=local, groups=groups, seed=1, round_idx=0, secure=None)
    (one,) = set(round_mechanisms(local, DIM, groups))
    assert own["rho"] == privacy_rho(one, 1)  # local: each device's own share, whatever its group


def test_a_run_reports_the_mechanisms_epsilon_without_amplification() -> None:
    x = synthetic(60, 120, seed=5)
    res = simulate(SimulationConfig(model="fedmf", rounds=2, clients_per_round=20, dp_noise=1.0, dp_clip=0.1,
                                    dp_mode="distributed", secagg=True, params={"k": 4}), interactions=x)
    assert res["dp"]["mechanism"] == "discrete-gaussian" and "epsilon_poisson_amplified" not in res
    rhos = [rec["dp"]["rho"] for rec in res["rounds"]]
    assert res["epsilon"] == pytest.approx(accounting.epsilon(rhos, 1e-5), rel=1e-9)
    assert all(rec["secagg_exact"] for rec in res["rounds"])
    assert all(rec["dp"]["sum_noise_multiplier_measured"] == pytest.approx(1.0, rel=0.25) for rec in res["rounds"])
    with pytest.raises(SimulationConfigError, match="zCDP"):
        SimulationConfig(model="fedmf", dp_noise=1.0, dp_clip=0.1, dp_accountant="pld")
    with pytest.raises(SimulationConfigError, match="dp-noise > 0"):
        SimulationConfig(model="fedmf", dp_noise=0.0, dp_clip=0.1)


def test_one_draw_per_group_is_the_share_by_share_law_at_the_same_price() -> None:
    """--unmasked-sum (D95): each group's noise drawn at once gives what the
    server decodes the same law as the shares drawn one by one (two-sample KS
    over 300 rounds, which sees a noise 25% larger) and the same entry."""
    u = _updates(0)
    groups = ((0, 1, 2), (3, 4, 5))
    want = _clipped_sum(u)
    one, each = [], []
    for r in range(300):
        fast, _, entry, _ = discrete_gaussian_round(u, dp=DP, groups=groups, seed=11, round_idx=r, secure=None,
                                                    one_draw_per_group=True)
        slow, _, again, _ = discrete_gaussian_round(u, dp=DP, groups=groups, seed=12, round_idx=r, secure=None)
        assert entry["rho"] == again["rho"] and entry["groups"] == again["groups"]
        one.append(fast.numpy() - want)
        each.append(slow.numpy() - want)
    a, b = np.concatenate(one), np.concatenate(each)
    assert stats.ks_2samp(a, b).pvalue > 1e-3
    assert stats.ks_2samp(a, b * 1.25).pvalue < 1e-3
    with pytest.raises(ValueError, match="without masks"):
        discrete_gaussian_round(u, dp=DP, groups=groups, seed=1, round_idx=0, one_draw_per_group=True,
                                secure=SecureAggregator(seed=3, neighbors="all"))


def test_an_unmasked_run_prices_what_the_secure_run_prices() -> None:
    x = synthetic(60, 120, seed=5)
    common: dict[str, Any] = dict(model="fedmf", rounds=2, clients_per_round=20, dp_noise=1.0, dp_clip=0.1, dp_mode="distributed",
                  params={"k": 4})
    secure = simulate(SimulationConfig(secagg=True, **common), interactions=x)
    plain = simulate(SimulationConfig(unmasked_sum=True, **common), interactions=x)
    assert plain["epsilon"] == secure["epsilon"] and plain["config"]["unmasked_sum"] is True
    assert all(rec["dp"]["sum_noise_multiplier_measured"] == pytest.approx(1.0, rel=0.25) for rec in plain["rounds"])
    assert not any("secagg_exact" in rec for rec in plain["rounds"])
    for bad, why in (({"secagg": True}, "use one of them"), ({"dp_mode": "local"}, "dp-mode distributed"),
                     ({"dp_mechanism": "gaussian-float"}, "discrete-gaussian")):
        with pytest.raises(SimulationConfigError, match=why):
            SimulationConfig(unmasked_sum=True, **{**common, **bad})
    with pytest.raises(SimulationConfigError, match="--unmasked-sum"):
        SimulationConfig(**common)


@pytest.mark.parametrize("one_draw", [False, True])
def test_rows_fed_in_any_pieces_give_the_whole_tables_round_bit_for_bit(one_draw: bool) -> None:
    """A round trained in chunks feeds its updates to `DiscreteGaussianSum`
    as they come: pieces that straddle the quantizing buffer (64 rows here)
    change no draw and no bit of the result, the norms or the entry."""
    from models.sim.dp_mechanism import DiscreteGaussianSum, row_chunk

    n, dim = 150, 5000  # padded to 8,192: buffers of 64 rows
    assert row_chunk(8192) == 64
    u = torch.randn(n, dim, generator=torch.Generator().manual_seed(3)) * 0.02
    kw: dict[str, Any] = dict(dp=DP, groups=[list(range(n))], seed=4, round_idx=2, secure=None,
                              one_draw_per_group=one_draw)
    whole, norms, entry, _ = discrete_gaussian_round(u, **kw)
    stream = DiscreteGaussianSum(n, dim, **kw)
    for a, b in ((0, 3), (3, 70), (70, 71), (71, 128), (128, 150)):
        stream.add(u[a:b])
    total, norms64, entry2, _ = stream.finish()
    assert torch.equal(total.to(torch.float32), whole) and torch.equal(norms64.to(torch.float32), norms)
    assert entry2 == entry
    short = DiscreteGaussianSum(n, dim, **kw)
    short.add(u[:10])
    with pytest.raises(ValueError, match="150 devices, 10 were added"):
        short.finish()
    with pytest.raises(ValueError, match="more than the round's 150 devices"):
        DiscreteGaussianSum(n, dim, **kw).add(torch.zeros(151, dim))
