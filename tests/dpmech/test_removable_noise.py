"""Dordis's removable noise (`dpmech.removable_noise`): the decomposition's
exact arithmetic, the seeded components, and the privacy bounds of what is
released after removal.

Oracles: Fraction arithmetic for the variances; the exact law of a sum of
discrete Gaussians of different variances, convolved here in log space
(as `dpmech.divergence` does for iid shares), for the Renyi divergence the
bounds must stay above and the pointwise closeness tau_het claims; a
seeded exact-sampler simulation for the kept noise's variance, within 4
standard errors of the variance estimate (2 of the target's 50 at 20,000
draws).
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import numpy.typing as npt
import pytest

from dpmech import accounting
from dpmech import removable_noise as rn
from dpmech.divergence import logsumexp
from dpmech.exact_sampler import check_variance, discrete_gaussian
from dpmech.random_source import GeneratorBytes, XofBytes

F64 = npt.NDArray[np.float64]
ALPHAS = (1.5, 2.0, 8.0, 32.0)


def _seed(i: int) -> bytes:
    return bytes([i]) * 32


# --- the decomposition -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,t", [(1, 1), (2, 1), (5, 3), (10, 7), (30, 1), (100, 67)])
def test_the_kept_variances_sum_to_the_target_exactly_for_every_survivor_count(n: int, t: int) -> None:
    target = Fraction(7919, 3)
    variances = rn.exact_component_variances(n, t, target)
    assert len(variances) == n - t + 1
    assert sum(variances, Fraction(0)) == target / t  # what one device adds in all
    for s in range(t, n + 1):
        kept = rn.kept_components(n, t, s)
        assert sum((variances[k] for k in kept), Fraction(0)) == target / s
        assert rn.released_variance(variances, n, t, s) == target


def test_the_components_removed_are_those_beyond_what_the_survivors_need() -> None:
    assert list(rn.removed_components(10, 7, 10)) == [1, 2, 3]  # nobody dropped: all the surplus goes
    assert list(rn.removed_components(10, 7, 9)) == [2, 3]
    assert list(rn.removed_components(10, 7, 7)) == []  # the worst tolerated dropout: nothing to remove
    assert list(rn.kept_components(10, 7, 8)) == [0, 1, 2]
    for s in range(7, 11):
        both = sorted([*rn.kept_components(10, 7, s), *rn.removed_components(10, 7, s)])
        assert both == list(range(4))


def test_variances_the_sampler_cannot_take_are_rounded_up_and_the_target_is_never_undershot() -> None:
    target = Fraction(2 * 10 ** 9 + 11, 3)
    exact = rn.exact_component_variances(50, 40, target)
    drawn = rn.component_variances(50, 40, target)
    assert any(d != e for d, e in zip(drawn, exact))  # this target needs rounding
    for d, e in zip(drawn, exact):
        assert d >= e
        check_variance(d)
        if d != e:  # rounded up on a grid 1/2^k, by less than one step of it
            assert d.denominator & (d.denominator - 1) == 0 and d - e < Fraction(1, d.denominator)
    for s in range(40, 51):
        assert rn.released_variance(drawn, 50, 40, s) >= target
    small = rn.component_variances(5, 3, Fraction(50))
    assert small == rn.exact_component_variances(5, 3, Fraction(50))  # exact where the sampler takes it


@pytest.mark.parametrize("call,message", [
    (lambda: rn.exact_component_variances(3, 4, Fraction(1)), "exceeds"),
    (lambda: rn.exact_component_variances(3, 0, Fraction(1)), "threshold"),
    (lambda: rn.exact_component_variances(0, 1, Fraction(1)), "devices"),
    (lambda: rn.exact_component_variances(3, 2, Fraction(-1)), "must be > 0"),
    (lambda: rn.exact_component_variances(3, 2, Fraction(0)), "must be > 0"),
    (lambda: rn.removed_components(10, 7, 6), "survivors must be in"),
    (lambda: rn.removed_components(10, 7, 11), "survivors must be in"),
    (lambda: rn.removal_cost(10, 7, 100, 4), "survivors must be in"),
    (lambda: rn.removal_cost(10, 7, 100, -1), "dropped"),
    (lambda: rn.component_seed(_seed(1), 0), "k >= 1"),
    (lambda: rn.component_seed(b"short", 1), "32 bytes"),
    (lambda: rn.heterogeneous_zcdp_rho(l2=1, l1=1, variances=[Fraction(-1)], padded_dim=1), "> 0"),
    (lambda: rn.heterogeneous_zcdp_rho(l2=1, l1=1, variances=[Fraction(1, 8)], padded_dim=1), ">= 1/4"),
    (lambda: rn.kept_rho(l2=1, l1=1, variances=(Fraction(1),), devices=1, threshold=1, survivors=1,
                         padded_dim=1, bound="other"), "bound must be"),
])
def test_invalid_inputs_are_refused_with_a_clear_message(call: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()  # type: ignore[operator]
    with pytest.raises(TypeError, match="Fraction"):
        rn.exact_component_variances(3, 2, 1.5)  # type: ignore[arg-type]


# --- seeded components -------------------------------------------------------------------------------------------

def test_a_seeded_component_is_reproduced_bit_for_bit_and_distinct_across_k_and_devices() -> None:
    v = Fraction(25, 6)
    first = rn.removable_component(_seed(1), 2, v, 5000)
    again = rn.removable_component(_seed(1), 2, v, 5000)
    assert first.dtype == np.int64 and np.array_equal(first, again)
    others = [rn.removable_component(_seed(1), 1, v, 5000), rn.removable_component(_seed(2), 2, v, 5000)]
    for other in others:
        assert np.mean(first == other) < 0.5  # independent draws agree at about sum_y P(y)^2 ~ 0.14
    seeds = {rn.component_seed(_seed(i), k) for i in range(4) for k in range(1, 6)}
    assert len(seeds) == 20
    # The sampler draws in batches sized by what is missing: another dim is
    # another array (not a prefix), so device and server must agree on dim.
    assert np.array_equal(rn.removable_component(_seed(1), 2, v, 100), rn.removable_component(_seed(1), 2, v, 100))


def test_the_xof_stream_does_not_depend_on_how_it_is_read() -> None:
    whole = XofBytes(_seed(3), b"d").take(3 * XofBytes.BLOCK + 17)
    pieces = XofBytes(_seed(3), b"d")
    parts = [pieces.take(n) for n in (0, 5, XofBytes.BLOCK, 2 * XofBytes.BLOCK + 12)]
    assert np.array_equal(np.concatenate(parts), whole)
    assert not np.array_equal(XofBytes(_seed(3), b"e").take(64), whole[:64])  # domain separation
    with pytest.raises(ValueError, match="32 bytes"):
        XofBytes(b"x", b"d")


def test_the_kept_noise_of_the_survivors_has_the_target_variance() -> None:
    """n = 5, t = 3, target 50: each device draws all its components
    (component 0 from its own generator, 1 and 2 from seeds); for s = 5, 4, 3
    the server removes the surplus from the survivors' noise, and what is left
    is exactly the kept components and has variance 50 per coordinate."""
    n, t, target, dim = 5, 3, Fraction(50), 20_000
    variances = rn.component_variances(n, t, target)
    base = [discrete_gaussian(dim, variances[0], GeneratorBytes(np.random.default_rng(100 + i))) for i in range(n)]
    full = [base[i] + rn.surplus(_seed(i), variances, range(1, n - t + 1), dim) for i in range(n)]
    for s in range(t, n + 1):
        removed = rn.removed_components(n, t, s)
        kept_total = np.zeros(dim, dtype=np.int64)
        for i in range(s):  # the first s devices survive
            kept = full[i] - rn.surplus(_seed(i), variances, removed, dim)
            expected = base[i] + rn.surplus(_seed(i), variances, range(1, n - s + 1), dim)
            assert np.array_equal(kept, expected)
            kept_total += kept
        assert abs(kept_total.mean()) < 4 * math.sqrt(50 / dim)
        assert abs(kept_total.var() - 50) < 2.0, (s, kept_total.var())  # 4 standard errors: 50 sqrt(2 / dim) = 0.5


# --- privacy -----------------------------------------------------------------------------------------------------

def _log_dg(v: Fraction, radius: int) -> F64:
    y = np.arange(-radius, radius + 1, dtype=np.float64)
    width = math.ceil(40 * math.sqrt(float(v))) + 10
    z = np.arange(-width, width + 1, dtype=np.float64)
    return np.asarray(-(y ** 2) / (2 * float(v)) - float(logsumexp(-(z ** 2) / (2 * float(v)))), dtype=np.float64)


def _log_sum_law(variances: list[Fraction], extra: int) -> F64:
    """log P[sum of independent N_Z(0, v_i) = z], z centred, each share cut at
    40 sigma_i + 10 + extra."""
    law = np.zeros(1)
    for v in variances:
        one = _log_dg(v, math.ceil(40 * math.sqrt(float(v))) + 10 + extra)
        grid = np.full((one.size, law.size + one.size - 1), -np.inf)
        for i in range(one.size):
            grid[i, i:i + law.size] = one[i] + law
        law = np.asarray(logsumexp(grid, axis=0), dtype=np.float64)
    return law


def _exact_divergence(variances: list[Fraction], shift: int, alpha: float) -> float:
    log_p = _log_sum_law(variances, math.ceil((alpha - 1) * shift) + shift)
    terms = alpha * log_p[shift:] + (1 - alpha) * log_p[:-shift]
    return float(logsumexp(terms)) / (alpha - 1)


CASES = {
    "n=4 t=2 s=3": rn.kept_variances(rn.component_variances(4, 2, Fraction(8)), 4, 2, 3),
    "n=4 t=2 s=2": rn.kept_variances(rn.component_variances(4, 2, Fraction(8)), 4, 2, 2),
    "n=3 t=1 s=1": rn.kept_variances(rn.component_variances(3, 1, Fraction(3, 2)), 3, 1, 1),
    "mixed, near 1/4": [Fraction(1, 4), Fraction(1, 3), Fraction(3), Fraction(1, 4)],
    "mixed, wide": [Fraction(9), Fraction(1, 2), Fraction(2)],
}


@pytest.mark.parametrize("name", list(CASES))
def test_both_bounds_are_never_below_the_exact_divergence(name: str) -> None:
    variances = CASES[name]
    for shift, alpha in itertools.product((1, 2, 3), ALPHAS):
        exact = _exact_divergence(variances, shift, alpha)
        full = rn.heterogeneous_rdp_bound(alpha, l2=shift, l1=shift, variances=variances, padded_dim=1)
        rho = rn.heterogeneous_zcdp_rho(l2=shift, l1=shift, variances=variances, padded_dim=1)
        assert full >= exact * (1 - 1e-12), (name, shift, alpha, full, exact)
        assert rho * alpha >= exact * (1 - 1e-12), (name, shift, alpha, rho, exact)
        if rho * alpha > 1e-6 and min(variances) >= 1:
            assert rho * alpha <= 1.05 * exact  # and tight where tau is negligible


@pytest.mark.parametrize("name", ["n=4 t=2 s=3", "n=4 t=2 s=2"])
def test_the_best_group_fallback_is_never_below_the_exact_divergence(name: str) -> None:
    n, t, s = 4, 2, int(name[-1])
    variances = rn.component_variances(n, t, Fraction(8))
    for shift, alpha in itertools.product((1, 2), ALPHAS):
        exact = _exact_divergence(rn.kept_variances(variances, n, t, s), shift, alpha)
        rho = rn.kept_rho(l2=shift, l1=shift, variances=variances, devices=n, threshold=t, survivors=s,
                          padded_dim=1, bound="best-group")
        assert rho * alpha >= exact * (1 - 1e-12)


@pytest.mark.parametrize("name", list(CASES))
def test_the_sum_is_pointwise_within_tau_het_of_one_discrete_gaussian(name: str) -> None:
    """The closeness the heterogeneous bound rests on, checked over the
    central +-10 sigma of the exact law (where it is computed to double
    precision)."""
    usable = [v for v in CASES[name] if v >= Fraction(1, 4)]
    total = sum(usable, Fraction(0))
    law = _log_sum_law(usable, 0)
    radius = law.size // 2
    reference = _log_dg(total, radius)
    centre = slice(radius - math.ceil(10 * math.sqrt(float(total))), radius + math.ceil(10 * math.sqrt(float(total))))
    gap = float(np.max(np.abs(law[centre] - reference[centre])))
    assert gap <= rn.heterogeneous_tau(usable) + 1e-12, (name, gap)


def test_the_per_step_constant_ten_covers_the_poisson_summation_error() -> None:
    """log((1+e)/(1-e)) <= 10 exp(-2 pi^2 h), e = 2 sum_l exp(-2 pi^2 l^2 h),
    for every harmonic variance h >= 1/8 (both shares >= 1/4)."""
    for h in np.linspace(0.125, 3.0, 400):
        e = 2 * sum(math.exp(-2 * math.pi ** 2 * l * l * h) for l in range(1, 50))
        assert math.log((1 + e) / (1 - e)) <= 10 * math.exp(-2 * math.pi ** 2 * h)


@pytest.mark.parametrize("sigma2,devices", [(Fraction(1, 4), 5), (Fraction(1), 3), (Fraction(4), 100)])
def test_iid_shares_give_the_accountants_tau_and_rho(sigma2: Fraction, devices: int) -> None:
    shares = [sigma2] * devices
    assert rn.heterogeneous_tau(shares) == pytest.approx(accounting.tau(devices, sigma2), rel=1e-9, abs=1e-300)
    rho = rn.heterogeneous_zcdp_rho(l2=3.0, l1=5.0, variances=shares, padded_dim=64)
    assert rho <= accounting.zcdp_rho(l2=3.0, l1=5.0, devices=devices, sigma2=sigma2, padded_dim=64) * (1 + 1e-8)


def test_after_removal_the_round_costs_the_targets_rho_whatever_the_dropout() -> None:
    """n = 10, t = 7, target 4000 = 1000 Delta^2 / 2 ... i.e. rho 1/2 at
    Delta^2 = 4000: the heterogeneous bound prices every survivor count as
    the target; the best-group fallback as D19's way would, or worse."""
    n, t, target = 10, 7, Fraction(4000)
    variances = rn.component_variances(n, t, target)
    l2 = math.sqrt(4000)
    for s in range(t, n + 1):
        het = rn.kept_rho(l2=l2, l1=l2, variances=variances, devices=n, threshold=t, survivors=s, padded_dim=4096)
        group = rn.kept_rho(l2=l2, l1=l2, variances=variances, devices=n, threshold=t, survivors=s, padded_dim=4096,
                            bound="best-group")
        assert het == pytest.approx(0.5, rel=1e-6)
        assert group >= 0.5 * n / s * (1 - 1e-6)


# --- costs -------------------------------------------------------------------------------------------------------

def test_the_cost_calculator() -> None:
    cost = rn.removal_cost(100, 67, 65_536, 10, target=Fraction(400))
    assert cost.device_variance == Fraction(400, 67)
    assert cost.d19_device_variance == 4
    assert cost.noise_factor == Fraction(100, 67)
    assert cost.extra_seeds_per_device == 33
    assert (cost.survivors, cost.removed_per_survivor) == (90, 23)
    assert cost.regenerated_draws == 90 * 23 * 65_536
    worst = rn.removal_cost(100, 67, 8, 33)
    assert (worst.removed_per_survivor, worst.regenerated_draws) == (0, 0)
    assert rn.removal_cost(100, 67, 8, 0).regenerated_draws == 100 * 33 * 8


def test_components_below_a_quarter_buy_nothing_on_paper() -> None:
    """n = 100, t = 67, target 400 (shares of sigma^2 = 4 each): every removable
    component is below 1/4 (v_1 = 400 / 9900), so the bound leaves them out
    and the round is priced as D19's way prices s shares; the noise must be
    scaled so that v_1 = target / (n (n - 1)) >= 1/4."""
    variances = rn.component_variances(100, 67, Fraction(400))
    assert max(variances[1:]) < Fraction(1, 4)
    rho = rn.kept_rho(l2=20, l1=20, variances=variances, devices=100, threshold=67, survivors=80, padded_dim=65_536)
    assert rho == pytest.approx(0.5 * 100 / 80, rel=1e-6)
