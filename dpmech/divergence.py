"""Exact laws over the integers, to check the samplers and the accountant against.

`discrete_gaussian_pmf` is N_Z(0, sigma^2)'s probability mass function.
`sum_log_pmf` is the exact law of n devices' noise shares in one coordinate
of a secure sum (the discrete Gaussian is not closed under sums), by
convolution in log space, so that the far tails keep their relative
precision. `divergence_of_sum` evaluates the Renyi divergence of that law
and its shift by k from the definition,

    D_alpha(P || Q) = log( sum_y P(y)^alpha Q(y)^(1 - alpha) ) / (alpha - 1),

over a support wide enough for both the mass (40 sigma per share: all but
exp(-800) of it) and the terms that dominate the sum, which sit near
y = -(alpha - 1) k. A product law (independent coordinates) has the sum of
its coordinates' divergences.

`python -m dpmech.divergence` prints the bound of `dpmech.accounting` next
to the exact divergence for a small grid.
"""

from __future__ import annotations

import argparse
import math
from fractions import Fraction

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]


def logsumexp(x: F64, axis: int | None = None) -> F64:
    """log(sum(exp(x))) along `axis` (all when None), without overflow; -inf
    entries count as zeros."""
    top = np.max(x, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    total = np.log(np.sum(np.exp(x - top), axis=axis, keepdims=True)) + top
    return np.asarray(np.squeeze(total, axis=axis) if axis is not None else total.reshape(()), dtype=np.float64)


def discrete_gaussian_pmf(sigma2: Fraction | float, radius: int) -> F64:
    """P[N_Z(0, sigma^2) = y] for y = -radius..radius (normalised over
    that range; exact to double precision once radius >= 40 sigma + 10)."""
    y = np.arange(-radius, radius + 1, dtype=np.float64)
    w = np.exp(-(y ** 2) / (2 * float(sigma2)))
    return np.asarray(w / w.sum(), dtype=np.float64)


def _log_discrete_gaussian(sigma2: float, radius: int) -> F64:
    y = np.arange(-radius, radius + 1, dtype=np.float64)
    width = math.ceil(40 * math.sqrt(sigma2)) + 10
    z = np.arange(-width, width + 1, dtype=np.float64)
    log_norm = float(logsumexp(-(z ** 2) / (2 * sigma2)))
    return np.asarray(-(y ** 2) / (2 * sigma2) - log_norm, dtype=np.float64)


def sum_log_pmf(sigma2: Fraction | float, devices: int, share_radius: int) -> F64:
    """log P[sum of `devices` independent N_Z(0, sigma^2) = z] for
    z = -R..R, R = devices * share_radius (each share cut at share_radius)."""
    if devices < 1:
        raise ValueError(f"devices must be >= 1, got {devices}")
    one = _log_discrete_gaussian(float(sigma2), share_radius)
    law = one
    for _ in range(devices - 1):
        size = law.size + one.size - 1
        grid = np.full((one.size, size), -np.inf)
        for i in range(one.size):  # row i: share value i - r added to the running law
            grid[i, i:i + law.size] = one[i] + law
        law = np.asarray(logsumexp(grid, axis=0), dtype=np.float64)
    return law


def divergence_of_sum(sigma2: Fraction | float, devices: int, shift: int, alpha: float) -> float:
    """D_alpha(S || S + shift) for S the sum of `devices` N_Z(0, sigma^2), exactly."""
    if alpha <= 1:
        raise ValueError(f"alpha must be > 1, got {alpha}")
    k = abs(int(shift))
    if k == 0:
        return 0.0
    share_radius = math.ceil((alpha - 1) * k) + k + math.ceil(40 * math.sqrt(float(sigma2))) + 10
    log_p = sum_log_pmf(sigma2, devices, share_radius)
    # P(y) against Q(y) = P(y - k): index i of P pairs with index i - k.
    terms = alpha * log_p[k:] + (1 - alpha) * log_p[:-k]
    return float(logsumexp(terms)) / (alpha - 1)


def _table(sigmas2: tuple[float, ...], devices: tuple[int, ...], alphas: tuple[float, ...]) -> list[str]:
    from dpmech import accounting  # the bound under check

    lines = ["sigma^2  n  shift  alpha  exact D_alpha  bound  bound/exact  rho*alpha/exact"]
    for s2, n, shift, alpha in ((s2, n, k, a) for s2 in sigmas2 for n in devices for k in (1, 2, 3) for a in alphas):
        exact = divergence_of_sum(s2, n, shift, alpha)
        l2 = float(shift)
        bound = accounting.rdp_bound(alpha, l2=l2, l1=l2, devices=n, sigma2=s2, padded_dim=1)
        rho = accounting.zcdp_rho(l2=l2, l1=l2, devices=n, sigma2=s2, padded_dim=1)
        lines.append(f"{s2:7g} {n:2d} {shift:6d} {alpha:6g} {exact:14.6g} {bound:10.6g} {bound / exact:11.4f} "
                     f"{rho * alpha / exact:15.4f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dpmech.divergence",
        description="Print the accountant's Renyi bound beside the exact Renyi divergence of a "
                    "sum of discrete Gaussian shares shifted by 1, 2 and 3 (one coordinate).")
    parser.add_argument("--sigma2", type=float, nargs="+", default=[0.25, 1.0, 4.0],
                        help="each device's noise variance sigma^2 (default: 0.25 1 4)")
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 5], help="shares summed (default: 1 2 5)")
    parser.add_argument("--alpha", type=float, nargs="+", default=[1.5, 2.0, 8.0, 32.0],
                        help="Renyi orders (default: 1.5 2 8 32)")
    args = parser.parse_args(argv)
    if min(args.sigma2) < 0.25 or min(args.devices) < 1 or min(args.alpha) <= 1:
        parser.error("need sigma^2 >= 0.25, devices >= 1 and alpha > 1")
    print("\n".join(_table(tuple(args.sigma2), tuple(args.devices), tuple(args.alpha))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
