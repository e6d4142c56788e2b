"""The Renyi DP of a secure sum of discrete Gaussian shares, and epsilon over rounds.

The mechanism's output is S = sum_i (xt_i + Z_i) over the n devices whose
inputs the secure sum counts, where xt_i is device i's rotated, scaled and
rounded update (||xt_i||_2^2 <= B, checked on the device) and Z_i has
independent N_Z(0, sigma^2) coordinates, in d' coordinates.

Adjacency: two inputs are neighbours when one device's update is replaced
by the zero vector (the device still adds its noise share); the protected
unit is one device, all of its data. The L2 sensitivity is then
Delta_2 = sqrt(B) and, the difference being an integer vector,
Delta_1 = min(sqrt(d') Delta_2, Delta_2^2). (Replacing one device's update by
another's doubles both: `sensitivities(..., replace_one=True)`.)

The bound (Kairouz, Liu and Steinke, "The Distributed Discrete Gaussian
Mechanism for Federated Learning with Secure Aggregation", ICML 2021,
Theorem 1 and Proposition 14 / Eq. 17; sigma >= 1/2): with
s2 = Delta_2 / (sqrt(n) sigma), s1 = Delta_1 / (sqrt(n) sigma) and
tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k + 1)),

    D_alpha(S || S') <= min( alpha s2^2 / 2 + tau d',
                             alpha (s2^2 + 2 s1 tau + tau^2 d') / 2,
                             alpha (s2 + tau sqrt(d'))^2 / 2 )     for alpha >= 1.

The last two terms say rho-zCDP with rho = `zcdp_rho` (their minimum over
2); that is what is composed: `dp_accounting`'s `ZCDpEvent` (rho * alpha
RDP at every order), self-composed over rounds by its RDP accountant, and
converted to (epsilon, delta) by it. For n = 1 (a single discrete
Gaussian, tau = 0) this is exactly the discrete Gaussian's
rho = Delta_2^2 / (2 sigma^2) (Canonne, Kamath and Steinke, "The Discrete
Gaussian for Differential Privacy", 2020). tau's terms fall with k from
exp(-pi^2 sigma^2), so for sigma >= 2, tau < 1e-16 whatever n, and the
bound is the continuous Gaussian's; at sigma = 1 and d' = 65,536,
tau sqrt(d') is already 0.14: keep sigma >= 2.
A round of several groups releases each group's sum; a device's data is in
one group, so the round costs its worst group's rho (`round_rho`).

No amplification by sampling is applied here: the cohort is not a
Poisson sample, and devices cannot check how it was drawn.

`dp_accounting` is imported by `epsilon` alone (it takes seconds to import):
a device computes rho without it.

tests/dpmech/test_dpmech_accounting.py checks the bound against the exact Renyi
divergence of the exact law of S computed over the integers
(`dpmech.divergence`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

# Float rounding in rho's few operations is far below this relative margin;
# applying it keeps every reported figure an upper bound.
_ROUND_UP = 1.0 + 1e-9


def tau(devices: int, sigma2: Fraction | float) -> float:
    """tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k/(k+1)) (0 for one device)."""
    if devices < 1:
        raise ValueError(f"devices must be >= 1, got {devices}")
    s2 = float(sigma2)
    total = math.fsum(math.exp(-2 * math.pi ** 2 * s2 * k / (k + 1)) for k in range(1, devices))
    return 10 * total * _ROUND_UP


def sensitivities(bound_sq: int, padded_dim: int, *, replace_one: bool = False) -> tuple[float, float]:
    """(Delta_2, Delta_1) of one device's rounded vector with ||.||^2 <= bound_sq."""
    if bound_sq < 0 or padded_dim < 1:
        raise ValueError("need bound_sq >= 0 and padded_dim >= 1")
    l2 = math.sqrt(bound_sq) * _ROUND_UP
    l1 = min(math.sqrt(padded_dim) * l2, float(bound_sq) * _ROUND_UP)
    factor = 2.0 if replace_one else 1.0
    return factor * l2, factor * l1


def _check(devices: int, sigma2: Fraction | float) -> float:
    s2 = float(sigma2)
    if devices < 1:
        raise ValueError(f"the sum needs >= 1 counted device, got {devices}")
    if not (math.isfinite(s2) and s2 >= 0.25):
        raise ValueError(f"the bound needs each device's sigma >= 1/2, got sigma^2 = {sigma2}")
    return s2


def rdp_bound(alpha: float, *, l2: float, l1: float, devices: int, sigma2: Fraction | float, padded_dim: int) -> float:
    """The full bound on D_alpha above (the minimum of its three terms)."""
    if alpha < 1:
        raise ValueError(f"alpha must be >= 1, got {alpha}")
    s2 = _check(devices, sigma2)
    t = tau(devices, s2)
    scale = math.sqrt(devices * s2)
    a2, a1 = l2 / scale, l1 / scale
    terms = (alpha * a2 ** 2 / 2 + t * padded_dim,
             alpha * (a2 ** 2 + 2 * a1 * t + t ** 2 * padded_dim) / 2,
             alpha * (a2 + t * math.sqrt(padded_dim)) ** 2 / 2)
    return min(terms) * _ROUND_UP


def zcdp_rho(*, l2: float, l1: float, devices: int, sigma2: Fraction | float, padded_dim: int) -> float:
    """rho such that the sum is rho-zCDP (D_alpha <= rho alpha for every alpha >= 1)."""
    s2 = _check(devices, sigma2)
    t = tau(devices, s2)
    scale = math.sqrt(devices * s2)
    a2, a1 = l2 / scale, l1 / scale
    return min(a2 ** 2 + 2 * a1 * t + t ** 2 * padded_dim, (a2 + t * math.sqrt(padded_dim)) ** 2) / 2 * _ROUND_UP


def round_rho(group_rhos: Sequence[float]) -> float:
    """A round's rho: its worst group's (each device's data is in one group)."""
    if not group_rhos:
        raise ValueError("a round has at least one group")
    if any(not (math.isfinite(r) and r >= 0) for r in group_rhos):
        raise ValueError(f"every rho must be finite and >= 0, got {list(group_rhos)}")
    return max(group_rhos)


def epsilon(round_rhos: Sequence[float], delta: float) -> float:
    """(epsilon, delta)-DP of rounds with these rho's, composed by
    dp_accounting's RDP accountant (identical rounds as one self-composed
    event). math.inf when a round had no noise (rho = inf)."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not round_rhos:
        return 0.0
    if any(math.isinf(r) for r in round_rhos):
        return math.inf
    if any(not r >= 0 for r in round_rhos):
        raise ValueError(f"every rho must be >= 0, got {list(round_rhos)}")
    import dp_accounting  # here, not at the top: ~2.4 s to import, and only epsilon needs it
    from dp_accounting import rdp

    accountant = rdp.RdpAccountant()
    for rho, count in sorted(Counter(round_rhos).items()):
        accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.ZCDpEvent(rho), count))
    eps = float(accountant.get_epsilon(delta))
    return eps if math.isfinite(eps) else math.inf
