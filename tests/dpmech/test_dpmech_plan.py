"""The planner (`dpmech.plan`) and the product's epsilon statements (`dpmech.claims`).

Oracles: the plan's epsilon recomputed from a `MechanismConfig` through
`mechanism.privacy_rho` and `accounting.epsilon` (what a round is priced
with); the continuous Gaussian's rho = 1/(2 z^2) for the multiplier the sum
carries (sigma >= 2, where the bound's tau term vanishes); dp_accounting's
own Poisson-sampled Gaussian; and the noise-to-signal ratio against noise
actually drawn (`fast_sampler`) and decoded (`mechanism.decode_sum`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp
from hypothesis import given
from hypothesis import strategies as st

from dpmech import accounting, claims, fast_sampler
from dpmech.mechanism import MechanismConfig, decode_sum, privacy_rho
from dpmech.plan import (
    Accounting,
    Noise,
    Plan,
    PlanError,
    PlanRequest,
    Shares,
    evaluate,
    geometry_for,
    group_sizes,
    least_multiplier,
    plan,
    rounding_scaled_clip,
)
from dpmech.rotation import padded_dimension

REQUEST = PlanRequest(population=20_000, cohort=100, rounds=50, delta=1e-6, target_epsilon=4.0, dropout=0.1,
                      group_size=40)


@pytest.fixture(scope="module")
def the_plan() -> Plan:
    return plan(REQUEST)


def test_the_found_multiplier_meets_the_target_and_one_percent_less_does_not(the_plan: Plan) -> None:
    r, g = the_plan.request, the_plan.geometry
    full = Shares.of(the_plan.groups)
    cases: tuple[tuple[Accounting, Noise], ...] = (("none", the_plan.primary), ("poisson", the_plan.amplified))
    for how, noise in cases:
        assert noise.epsilon_total <= r.target_epsilon
        less = evaluate(0.99 * noise.noise_multiplier, r, g, full, how)
        assert less.epsilon_total > r.target_epsilon, how
    assert the_plan.amplified.noise_multiplier < the_plan.primary.noise_multiplier  # sampling only ever helps


def test_the_plans_epsilon_is_the_mechanisms_own_accounting(the_plan: Plan) -> None:
    """Cross-check: a round of the planned configuration priced as dpmech prices it."""
    r, g = the_plan.request, the_plan.geometry
    rhos = []
    for size in set(the_plan.groups):
        config = MechanismConfig(dim=r.dim, clip=r.clip, scale=g.scale, sigma2=the_plan.primary.device_sigma2[size],
                                 bits=r.bits, devices=r.cohort)
        assert (config.bound_sq, config.padded_dim) == (g.bound_sq, g.padded_dim)
        rhos.append(privacy_rho(config, size))
    eps = accounting.epsilon([accounting.round_rho(rhos)] * r.rounds, r.delta)
    assert the_plan.primary.epsilon_total == pytest.approx(eps, rel=1e-12)
    # the multiplier the sum carries means what it says: rho = 1/(2 z^2) (sigma >= 2: tau < 1e-16)
    assert the_plan.primary.device_sigma >= 2
    z = the_plan.primary.sum_multiplier
    assert the_plan.primary.rho_round == pytest.approx(1 / (2 * z * z), rel=1e-6)
    assert z >= the_plan.primary.noise_multiplier  # shares are rounded up, never down
    # the assumption's column is dp_accounting's Poisson-sampled Gaussian at rate B/N
    a = the_plan.amplified
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        r.cohort / r.population, dp_accounting.GaussianDpEvent(1 / math.sqrt(2 * a.rho_round))), r.rounds))
    assert a.epsilon_total == pytest.approx(acc.get_epsilon(r.delta), rel=1e-9)


def test_more_rounds_a_smaller_target_or_delta_need_more_noise() -> None:
    base = PlanRequest(population=10_000, cohort=200, rounds=10, delta=1e-5, target_epsilon=4.0, dim=1000)
    geometry = geometry_for(base, rounding_scaled_clip(padded_dimension(base.dim)))
    shares = Shares.of((200,))

    def z(request: PlanRequest) -> float:
        return least_multiplier(request, geometry, shares, "none")

    by_rounds = [z(dataclasses.replace(base, rounds=t)) for t in (1, 10, 100, 1000)]
    assert by_rounds == sorted(by_rounds) and len(set(by_rounds)) == 4
    by_target = [z(dataclasses.replace(base, target_epsilon=e)) for e in (1.0, 4.0, 16.0)]
    assert by_target == sorted(by_target, reverse=True) and len(set(by_target)) == 3
    assert z(dataclasses.replace(base, delta=1e-9)) > z(base)


def test_the_noise_to_signal_ratio_is_the_noise_actually_drawn() -> None:
    """sigma_sum sqrt(d) / (B c): shares drawn from the simulator's sampler
    (the exact sampler's law), summed, decoded; the mean's noise norm over
    the clip, averaged over 3 draws, within 6% (its spread is ~1/sqrt(2d))."""
    request = PlanRequest(population=1_000, cohort=20, rounds=20, delta=1e-5, target_epsilon=8.0, dim=1000, clip=0.5)
    p = plan(request)
    n = p.primary
    sigma2 = n.device_sigma2[20]
    assert n.noise_norm_of_mean == pytest.approx(
        math.sqrt(20 * float(sigma2)) / p.geometry.scale * math.sqrt(1000) / 20, rel=1e-12)
    config = MechanismConfig(dim=1000, clip=0.5, scale=p.geometry.scale, sigma2=sigma2, bits=32, devices=20)
    rng = np.random.default_rng(7)
    seed = b"\x01" * 32
    ratios = []
    for _ in range(3):
        total = fast_sampler.sum_of_discrete_gaussians(rng, 20, config.padded_dim, sigma2)
        mean = decode_sum(total, config, seed) / 20
        ratios.append(float(np.linalg.norm(mean)) / 0.5)
    assert float(np.mean(ratios)) == pytest.approx(n.noise_to_signal, rel=0.06)


def test_groups_and_dropouts(the_plan: Plan) -> None:
    assert group_sizes(100, 40) == (50, 50) and group_sizes(999, 500) == (999,) and group_sizes(1001, 500) == (500, 501)
    assert group_sizes(7, None) == (7,)
    assert the_plan.groups == (50, 50)
    assert the_plan.grouping_cost == pytest.approx(math.sqrt(2), rel=0.01)
    d = the_plan.dropout
    assert d is not None and d.counted == (45, 45)
    # the plan's shares: only the counted ones reach the sum; epsilon misses the target
    assert d.with_plan_noise.sum_multiplier == pytest.approx(the_plan.primary.sum_multiplier * math.sqrt(0.9), rel=1e-3)
    assert d.with_plan_noise.epsilon_total > REQUEST.target_epsilon
    # shares calibrated to the counted devices keep it, at more noise per device
    assert d.keep_target.epsilon_total <= REQUEST.target_epsilon
    assert d.keep_target.device_sigma > the_plan.primary.device_sigma


def test_refusals_say_what_to_change() -> None:
    with pytest.raises(PlanError, match=r"2\^12 is too small.*needs w >= 1[5-9] bits"):
        plan(PlanRequest(population=10_000, cohort=1_000, rounds=10, delta=1e-6, target_epsilon=8.0, bits=12))
    with pytest.raises(PlanError, match="out of reach.*larger cohort"):
        plan(PlanRequest(population=10_000, cohort=10, rounds=1_000, delta=1e-6, target_epsilon=0.01))
    bad: tuple[tuple[Callable[[], PlanRequest], str], ...] = (
        (lambda: dataclasses.replace(REQUEST, cohort=20_001), "cannot exceed"),
        (lambda: dataclasses.replace(REQUEST, delta=1.0), "delta"),
        (lambda: dataclasses.replace(REQUEST, target_epsilon=0.0), "target epsilon"),
        (lambda: dataclasses.replace(REQUEST, dropout=1.0), "dropout"),
        (lambda: dataclasses.replace(REQUEST, group_size=1), "group size"),
        (lambda: dataclasses.replace(REQUEST, bits=70), "bits"),
        (lambda: dataclasses.replace(REQUEST, cohort=1), "at least 2"))
    for make, words in bad:
        with pytest.raises(PlanError, match=words):
            make()


def test_the_production_line_holds_the_mean_updates_noise() -> None:
    line = claims.production_line(1.0, 450)
    assert line is not None
    assert line.noise_multiplier == pytest.approx(1000 / 450)
    # priced like a plan's round: the realised shares' rho, composed by dpmech's accountant
    z = line.noise_multiplier
    continuous = accounting.epsilon([1 / (2 * z * z)] * 100, 1e-7)
    assert continuous * 0.999 <= line.epsilon <= continuous * 1.001
    assert line.epsilon_if_poisson < line.epsilon
    assert line.text.startswith("At 1,000,000 devices, cohorts of 1,000, 100 rounds")
    assert f"epsilon {claims.epsilon_text(line.epsilon)} at delta 1e-07" in line.text
    assert claims.production_line(0.0, 450) is None and claims.production_line(1.0, 0) is None
    s = claims.statement(34.1163, 1e-5, 24, amplified=False)
    assert s.startswith("epsilon 34.12 at delta 1e-05 over 24 rounds protects one device, all of its data")


@given(st.floats(min_value=1e-6, max_value=1e6, allow_nan=False))
def test_a_printed_epsilon_is_never_below_the_computed_one(eps: float) -> None:
    shown = float(claims.epsilon_text(eps))
    assert eps <= shown <= eps * 1.011
