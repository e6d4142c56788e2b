"""The accountant's bound against the exact Renyi divergence, and epsilon
through dp_accounting.

Oracle: `dpmech.divergence.divergence_of_sum`, the Renyi divergence of the
exact law of a sum of n discrete Gaussian shares and its integer shift,
evaluated from the definition over the integers (log space, support wide
enough for the terms that dominate). The bound must be >= it everywhere,
and not loose where the mechanism runs: the composed zCDP form within 1%
for sigma >= 1; at the smallest sigma the bound allows (1/2, where tau is
large) the three-term bound within a factor 3.5 and its zCDP form 8.5.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import dp_accounting
import pytest
from dp_accounting import rdp

from dpmech import accounting
from dpmech.divergence import divergence_of_sum

ALPHAS = (1.5, 2.0, 8.0, 32.0)


def _ratios(sigma2: Fraction, devices: int) -> tuple[list[float], list[float]]:
    """(full bound / exact, composed rho-zCDP / exact) over shifts 1..3 and ALPHAS."""
    full_ratios, rho_ratios = [], []
    for shift, alpha in itertools.product((1, 2, 3), ALPHAS):
        exact = divergence_of_sum(sigma2, devices, shift, alpha)
        full = accounting.rdp_bound(alpha, l2=shift, l1=shift, devices=devices, sigma2=sigma2, padded_dim=1)
        rho = accounting.zcdp_rho(l2=shift, l1=shift, devices=devices, sigma2=sigma2, padded_dim=1)
        assert full >= exact * (1 - 1e-12), (sigma2, devices, shift, alpha, full, exact)
        assert rho * alpha >= exact * (1 - 1e-12), (sigma2, devices, shift, alpha, rho, exact)
        full_ratios.append(full / exact)
        rho_ratios.append(rho * alpha / exact)
    return full_ratios, rho_ratios


@pytest.mark.parametrize("devices", [1, 2, 5])
def test_the_bound_is_above_the_exact_divergence_and_tight_for_sigma_at_least_one(devices: int) -> None:
    for sigma2 in (Fraction(1), Fraction(9, 4), Fraction(16)):
        assert max(_ratios(sigma2, devices)[1]) <= 1.01


def test_the_bound_holds_at_the_smallest_sigma_where_tau_matters() -> None:
    full, rho = (sum(parts, []) for parts in zip(_ratios(Fraction(1, 4), 2), _ratios(Fraction(1, 4), 5)))
    assert max(full) <= 3.5  # the three-term bound
    assert max(rho) <= 8.5  # its zCDP form, what is composed: looser at the smallest alpha
    assert accounting.tau(5, Fraction(1, 4)) > 0.1  # the regime where tau is not negligible


def test_a_product_of_coordinates_meets_the_multivariate_bound() -> None:
    """Shift vectors in d' = 2 and 3 with integer coordinates: the exact
    divergence (a sum over coordinates) stays under the bound at their L2 norm."""
    sigma2, devices = Fraction(2), 3
    for shift in ((1, 1), (2, 1), (1, 1, 1), (3, 0, 1)):
        l2 = math.sqrt(sum(s * s for s in shift))
        l1 = float(sum(shift))
        for alpha in ALPHAS:
            exact = sum(divergence_of_sum(sigma2, devices, s, alpha) for s in shift)
            bound = accounting.rdp_bound(alpha, l2=l2, l1=l1, devices=devices, sigma2=sigma2, padded_dim=len(shift))
            assert bound >= exact * (1 - 1e-12)


def test_one_device_is_the_discrete_gaussian_rho() -> None:
    """n = 1: tau = 0 and rho = Delta^2 / (2 sigma^2) (Canonne et al.)."""
    assert accounting.tau(1, Fraction(3)) == 0.0
    rho = accounting.zcdp_rho(l2=4.0, l1=16.0, devices=1, sigma2=Fraction(3), padded_dim=65_536)
    assert rho == pytest.approx(16 / 6, rel=1e-8) and rho >= 16 / 6


def test_dropouts_and_groups_raise_rho() -> None:
    def rho(devices: int) -> float:
        return accounting.zcdp_rho(l2=100.0, l1=1e4, devices=devices, sigma2=Fraction(400), padded_dim=65_536)

    full, fewer = rho(100), rho(90)
    assert fewer == pytest.approx(full * 100 / 90, rel=1e-9)
    assert accounting.round_rho([full, fewer]) == fewer
    with pytest.raises(ValueError):
        accounting.round_rho([])


def test_epsilon_is_dp_accountings_for_the_same_renyi_curve() -> None:
    """rho-zCDP has the RDP curve of the Gaussian mechanism with noise
    multiplier 1 / sqrt(2 rho): the two epsilons agree; composition over
    rounds of different rho is the accountant's, not a worst-round bound."""
    rho, rounds, delta = 0.02, 50, 1e-6
    gaussian = rdp.RdpAccountant()
    gaussian.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(1 / math.sqrt(2 * rho)), rounds))
    assert accounting.epsilon([rho] * rounds, delta) == pytest.approx(gaussian.get_epsilon(delta), rel=1e-9)
    mixed = accounting.epsilon([rho] * 25 + [2 * rho] * 25, delta)
    assert accounting.epsilon([rho] * rounds, delta) < mixed < accounting.epsilon([2 * rho] * rounds, delta)
    assert accounting.epsilon([], delta) == 0.0
    assert accounting.epsilon([rho, math.inf], delta) == math.inf


def test_sensitivities_of_the_rounded_vector() -> None:
    l2, l1 = accounting.sensitivities(10_000, 65_536)
    assert l2 == pytest.approx(100.0) and l2 >= 100.0
    assert l1 == pytest.approx(10_000.0)  # integer coordinates: ||v||_1 <= ||v||_2^2
    assert accounting.sensitivities(10_000, 4)[1] == pytest.approx(200.0)  # sqrt(d) ||v||_2
    assert accounting.sensitivities(10_000, 65_536, replace_one=True)[0] == pytest.approx(200.0)


def test_sigma_below_one_half_is_refused() -> None:
    with pytest.raises(ValueError, match="sigma >= 1/2"):
        accounting.zcdp_rho(l2=1.0, l1=1.0, devices=3, sigma2=Fraction(1, 5), padded_dim=4)
