"""Dropout-resilient noise: shares sized for the worst tolerated dropout, the
survivors' surplus regenerated from seeds and removed (XNoise's arithmetic).

Pure functions only: nothing here sends, shares or reconstructs a seed.
The scheme is that of Jiang, Shi, Chen, Chen and Wang, "Dordis: Efficient
Federated Learning with Dropout-Resilient Differential Privacy" (EuroSys
2024); the noise is the distributed discrete Gaussian of `dpmech.accounting`.

The decomposition. A group of n devices, threshold t (at least t survive,
at most n - t drop), target variance sigma_T^2 per coordinate of the
released sum (an exact Fraction, integer units). Device i adds
xi_0 + xi_1 + ... + xi_{n-t}, independent N_Z(0, v_k) coordinates, with

    v_0 = sigma_T^2 / n,    v_k = sigma_T^2 (1/(n-k) - 1/(n-k+1)) = sigma_T^2 / ((n-k)(n-k+1)),  k >= 1.

With s = n - j survivors (0 <= j <= n - t), each survivor's components
j+1 .. n-t are removed (`removed_components`) and it keeps v_0 + ... + v_j =
sigma_T^2 / s: the sum carries exactly sigma_T^2. A device adds
sigma_T^2 / t in all (D19's way: sigma_T^2 / n). Every v_k is exact in
Fraction arithmetic; where the exact sampler cannot draw it
(`exact_sampler.check_variance`: 2 a b t^2 <= 2^62, a < 2^31 for v = a/b)
it is rounded UP to ceil(v 2^e) / 2^e with the largest e in 32..0 the
sampler takes, so the kept sum's variance is never below the target.

Seeds. Component 0 is drawn from the device's CSPRNG and never leaves it.
Component k >= 1 is drawn by the exact sampler over SHAKE-256 expanded from
its own 32-byte seed, `component_seed(device_seed, k)` (domain-separated):
whoever holds that seed regenerates it bit for bit (`removable_component`).
The device seed itself must never be shared; each component seed is
secret-shared on its own, so that reconstructing the seeds of removed
components reveals nothing of the kept ones. Kept seeded components are
pseudorandom to a server without their seeds: their privacy is
computational (SHAKE-256 as a PRF), as SecAgg's masks are.

Privacy of what is released. The kept noise of a coordinate is a sum of
m = s (j + 1) independent discrete Gaussians of variances u_1..u_m (s copies
of each kept v_k): not iid, so `accounting`'s bound (n iid shares) does not
apply as it stands. Two bounds:

- `heterogeneous_zcdp_rho` (the one `kept_rho` uses by default): KLS's bound
  with n sigma^2 replaced by V = sum u_i and their tau by
  tau_het = 10 sum_{k=1}^{m-1} exp(-2 pi^2 h_k), h_k = V_k u_{k+1} / V_{k+1},
  V_k = u_1 + ... + u_k. Argument: Poisson summation gives, for
  X ~ N_Z(0, a), Y ~ N_Z(0, b), P[X + Y = z] / N_Z(0, a + b)(z) within
  [(1 - e)/(1 + e), (1 + e)/(1 - e)], e = 2 sum_{l>=1} exp(-2 pi^2 l^2 ab/(a+b)),
  and such pointwise ratios compose when one adds one share at a time, so
  the sum is within exp(+-sum_k log((1+e_k)/(1-e_k))) of N_Z(0, V) pointwise;
  10 exp(-2 pi^2 h) bounds log((1+e)/(1-e)) for h >= 1/8 (every u >= 1/4).
  For iid shares h_k = sigma^2 k/(k+1): exactly KLS's tau (Kairouz, Liu and
  Steinke, "The Distributed Discrete Gaussian Mechanism for Federated
  Learning with Secure Aggregation", ICML 2021, Theorem 1, Proposition 14).
  It assumes their passage from this pointwise closeness to the Renyi bound
  (their Eq. 17) uses nothing else of the iid case. Components below 1/4
  are left out (independent noise added to a released value is
  post-processing: it cannot raise a Renyi divergence), and so may any tail
  of the components sorted by variance: the least rho over those prefixes is
  reported.
- `best_group_rho`: the proven fallback. Component k of the s survivors is
  s iid shares of v_k, so `accounting.zcdp_rho(s, v_k)` holds for the sum
  alone (Theorem 1), and the other components are post-processing; the
  least over k. Loose: it prices the round as D19's way prices s counted
  shares, at best.

tests/dpmech/test_removable_noise.py checks both against the exact Renyi
divergence of the exact law of the kept sum (`dpmech.divergence`).

Costs (`removal_cost`): per device sigma_T^2 / t of noise, n - t extra seeds
to secret-share; at unmasking, (n - t - dropped) components of d
coordinates regenerated for each of the s survivors.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpmech import accounting
from dpmech.exact_sampler import check_variance, discrete_gaussian
from dpmech.random_source import I64, XofBytes

SEED_BYTES = XofBytes.SEED_BYTES
_DOMAIN = b"fedmask/dpmech/removable-noise/v1"
_SEED_DOMAIN = _DOMAIN + b"/component-seed"
_DRAW_DOMAIN = _DOMAIN + b"/draws"
_ROUND_UP = 1.0 + 1e-9  # as in `accounting`: float rounding below this margin
_MIN_SHARE_VARIANCE = Fraction(1, 4)  # KLS's sigma >= 1/2, per component
_FINEST_GRID_LOG2 = 32


def _check_group(devices: int, threshold: int) -> None:
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"devices (n) must be an int >= 1, got {devices!r}")
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise ValueError(f"threshold (t) must be an int >= 1 (at least one device must survive), got {threshold!r}")
    if threshold > devices:
        raise ValueError(f"threshold t = {threshold} exceeds the group's n = {devices} devices: need 1 <= t <= n")


def _check_target(target: Fraction) -> None:
    if not isinstance(target, Fraction):
        raise TypeError(f"the target variance must be a fractions.Fraction (exact), got {type(target).__name__}")
    if target <= 0:
        raise ValueError(f"the target variance must be > 0, got {target}")


def _survivors_dropped(devices: int, threshold: int, survivors: int) -> int:
    """j = n - s, checking t <= s <= n."""
    _check_group(devices, threshold)
    if not threshold <= survivors <= devices:
        raise ValueError(f"survivors must be in [t, n] = [{threshold}, {devices}], got {survivors}: more than "
                         f"n - t = {devices - threshold} dropped is beyond what the shares were sized for")
    return devices - survivors


def sampleable(variance: Fraction) -> Fraction:
    """`variance` itself when the exact sampler draws it, else the least
    ceil(variance 2^e) / 2^e (e from 32 down to 0) that it draws: never
    below `variance`. ValueError when even an integer is too large."""
    try:
        check_variance(variance)
        return variance
    except ValueError:
        pass
    for e in range(_FINEST_GRID_LOG2, -1, -1):
        grid = 1 << e
        up = Fraction(-(-variance.numerator * grid // variance.denominator), grid)
        try:
            check_variance(up)
            return up
        except ValueError:
            continue
    raise ValueError(f"variance {variance} is beyond the exact sampler's range even rounded up to an integer")


def exact_component_variances(devices: int, threshold: int, target: Fraction) -> tuple[Fraction, ...]:
    """(v_0, ..., v_{n-t}) exactly: v_0 = target/n, v_k = target/((n-k)(n-k+1))."""
    _check_group(devices, threshold)
    _check_target(target)
    return (target / devices,) + tuple(target / ((devices - k) * (devices - k + 1))
                                       for k in range(1, devices - threshold + 1))


def component_variances(devices: int, threshold: int, target: Fraction) -> tuple[Fraction, ...]:
    """What a device draws: `exact_component_variances`, each rounded up
    (`sampleable`) only where the exact sampler needs it."""
    return tuple(sampleable(v) for v in exact_component_variances(devices, threshold, target))


def removed_components(devices: int, threshold: int, survivors: int) -> range:
    """The components k each survivor's surplus consists of: j+1 .. n-t, j = n - s."""
    dropped = _survivors_dropped(devices, threshold, survivors)
    return range(dropped + 1, devices - threshold + 1)


def kept_components(devices: int, threshold: int, survivors: int) -> range:
    """The components each survivor's noise keeps: 0 .. j, j = n - s."""
    return range(0, _survivors_dropped(devices, threshold, survivors) + 1)


def released_variance(variances: tuple[Fraction, ...], devices: int, threshold: int, survivors: int) -> Fraction:
    """The released sum's noise variance per coordinate: s (v_0 + ... + v_j)
    (the discrete Gaussian's variance is at most its parameter; within
    exp(-2 pi^2 v) of it)."""
    if len(variances) != devices - threshold + 1:
        raise ValueError(f"need n - t + 1 = {devices - threshold + 1} component variances, got {len(variances)}")
    kept = kept_components(devices, threshold, survivors)
    return survivors * sum((variances[k] for k in kept), Fraction(0))


# --- seeded components -------------------------------------------------------------------------------------------

def component_seed(device_seed: bytes, k: int) -> bytes:
    """Component k's own 32-byte seed: SHAKE-256 of a domain, the device seed
    and k (4 bytes). Distinct k give independent-looking seeds; only k >= 1
    is seeded (component 0 comes from the device's CSPRNG)."""
    if len(device_seed) != SEED_BYTES:
        raise ValueError(f"the device seed must be {SEED_BYTES} bytes, got {len(device_seed)}")
    if not 1 <= k < 1 << 32:
        raise ValueError(f"only components k >= 1 are seeded, got k = {k}")
    message = len(_SEED_DOMAIN).to_bytes(2, "big") + _SEED_DOMAIN + device_seed + k.to_bytes(4, "big")
    return hashlib.shake_256(message).digest(SEED_BYTES)


def removable_component(seed: bytes, k: int, variance: Fraction, dim: int) -> I64:
    """Component k (>= 1) of the device whose device seed is `seed`: `dim`
    draws of N_Z(0, variance), exactly, over SHAKE-256 expanded from
    `component_seed(seed, k)`. Same arguments, same array, bit for bit, on
    the device that adds it and on the server that removes it. The array
    depends on `dim` as a whole (the sampler draws in batches sized by what
    is missing): a shorter dim is not a prefix, so both sides pass the same."""
    return component_noise(component_seed(seed, k), variance, dim)


def component_noise(seed: bytes, variance: Fraction, dim: int) -> I64:
    """`dim` exact draws of N_Z(0, variance) over SHAKE-256 expanded from one
    component's own 32-byte seed (what the secure sum shares and rebuilds)."""
    if dim < 0:
        raise ValueError(f"dim must be >= 0, got {dim}")
    if len(seed) != SEED_BYTES:
        raise ValueError(f"a component seed is {SEED_BYTES} bytes, got {len(seed)}")
    return discrete_gaussian(dim, variance, XofBytes(seed, _DRAW_DOMAIN))


def surplus(seed: bytes, variances: tuple[Fraction, ...], removed: range, dim: int) -> I64:
    """The sum of a survivor's removed components (what the server subtracts)."""
    total = np.zeros(dim, dtype=np.int64)
    for k in removed:
        total += removable_component(seed, k, variances[k], dim)
    return total


# --- privacy of the released sum ---------------------------------------------------------------------------------

def kept_variances(variances: tuple[Fraction, ...], devices: int, threshold: int, survivors: int) -> list[Fraction]:
    """Every independent discrete Gaussian in one coordinate of the released
    sum: s copies of each kept v_k."""
    if len(variances) != devices - threshold + 1:
        raise ValueError(f"need n - t + 1 = {devices - threshold + 1} component variances, got {len(variances)}")
    return [variances[k] for k in kept_components(devices, threshold, survivors) for _ in range(survivors)]


def _usable(variances: list[Fraction] | tuple[Fraction, ...]) -> np.ndarray:
    """The variances >= 1/4, largest first, as floats (the others are left out:
    post-processing)."""
    if any(not v > 0 for v in variances):
        raise ValueError(f"every variance must be > 0, got {sorted(set(variances))[:3]}...")
    kept = sorted((float(v) for v in variances if v >= _MIN_SHARE_VARIANCE), reverse=True)
    if not kept:
        raise ValueError("no component has variance >= 1/4: the bound needs at least one")
    return np.asarray(kept, dtype=np.float64)


def _prefix_sums_and_taus(usable: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(V_p, tau_p) for every prefix p = 1..m of `usable`: V_p its sum and
    tau_p = 10 sum_{k<p} exp(-2 pi^2 V_k u_{k+1} / V_{k+1})."""
    v = np.cumsum(usable)
    harmonic = v[:-1] * usable[1:] / v[1:]
    steps = 10.0 * np.exp(-2.0 * math.pi ** 2 * harmonic)
    taus = np.concatenate(([0.0], np.cumsum(steps))) * _ROUND_UP
    return v, taus


def heterogeneous_tau(variances: list[Fraction] | tuple[Fraction, ...]) -> float:
    """tau_het of all the variances >= 1/4, largest first."""
    return float(_prefix_sums_and_taus(_usable(variances))[1][-1])


def heterogeneous_rdp_bound(alpha: float, *, l2: float, l1: float, variances: list[Fraction] | tuple[Fraction, ...],
                            padded_dim: int) -> float:
    """KLS's three-term bound on D_alpha with n sigma^2 -> V and tau -> tau_het,
    least over the prefixes (largest first) of the variances >= 1/4."""
    if alpha < 1:
        raise ValueError(f"alpha must be >= 1, got {alpha}")
    v, taus = _prefix_sums_and_taus(_usable(variances))
    a2, a1 = l2 / np.sqrt(v), l1 / np.sqrt(v)
    terms = np.minimum.reduce([alpha * a2 ** 2 / 2 + taus * padded_dim,
                               alpha * (a2 ** 2 + 2 * a1 * taus + taus ** 2 * padded_dim) / 2,
                               alpha * (a2 + taus * math.sqrt(padded_dim)) ** 2 / 2])
    return float(terms.min()) * _ROUND_UP


def heterogeneous_zcdp_rho(*, l2: float, l1: float, variances: list[Fraction] | tuple[Fraction, ...],
                           padded_dim: int) -> float:
    """rho with D_alpha <= rho alpha for all alpha >= 1, from the bound's last
    two terms (as `accounting.zcdp_rho`), least over the prefixes."""
    v, taus = _prefix_sums_and_taus(_usable(variances))
    a2, a1 = l2 / np.sqrt(v), l1 / np.sqrt(v)
    rho = np.minimum(a2 ** 2 + 2 * a1 * taus + taus ** 2 * padded_dim, (a2 + taus * math.sqrt(padded_dim)) ** 2) / 2
    return float(rho.min()) * _ROUND_UP


def best_group_rho(*, l2: float, l1: float, variances: tuple[Fraction, ...], devices: int, threshold: int,
                   survivors: int, padded_dim: int) -> float:
    """The proven fallback: the least `accounting.zcdp_rho(s, v_k)` over the
    kept components k with v_k >= 1/4 (one iid group alone; the rest is
    post-processing)."""
    kept = [variances[k] for k in kept_components(devices, threshold, survivors)
            if variances[k] >= _MIN_SHARE_VARIANCE]
    if not kept:
        raise ValueError("no kept component has variance >= 1/4: the bound needs at least one")
    return min(accounting.zcdp_rho(l2=l2, l1=l1, devices=survivors, sigma2=v, padded_dim=padded_dim) for v in kept)


def kept_rho(*, l2: float, l1: float, variances: tuple[Fraction, ...], devices: int, threshold: int, survivors: int,
             padded_dim: int, bound: str = "heterogeneous") -> float:
    """The released sum's rho after removal: bound "heterogeneous"
    (`heterogeneous_zcdp_rho`) or "best-group" (`best_group_rho`)."""
    if bound == "heterogeneous":
        return heterogeneous_zcdp_rho(l2=l2, l1=l1, padded_dim=padded_dim,
                                      variances=kept_variances(variances, devices, threshold, survivors))
    if bound == "best-group":
        return best_group_rho(l2=l2, l1=l1, variances=variances, devices=devices, threshold=threshold,
                              survivors=survivors, padded_dim=padded_dim)
    raise ValueError(f"bound must be 'heterogeneous' or 'best-group', got {bound!r}")


# --- what it costs -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RemovalCost:
    """What Dordis's way costs a group of n with threshold t, d coordinates
    and `dropped` devices gone, against D19's way (variances in units of
    the target sigma_T^2 unless a target was given)."""

    devices: int
    threshold: int
    dim: int
    dropped: int
    device_variance: Fraction        # sigma_T^2 / t: what each device adds
    d19_device_variance: Fraction    # sigma_T^2 / n: D19's share
    extra_seeds_per_device: int      # n - t component seeds, each secret-shared
    survivors: int                   # s = n - dropped
    removed_per_survivor: int        # n - t - dropped components
    regenerated_draws: int           # s (n - t - dropped) d exact draws at unmasking

    @property
    def noise_factor(self) -> Fraction:
        """How much more noise a device adds than D19's: n / t."""
        return self.device_variance / self.d19_device_variance


def removal_cost(devices: int, threshold: int, dim: int, dropped: int, target: Fraction = Fraction(1)) -> RemovalCost:
    """The pure cost figures of Dordis's way (exact decomposition, before any
    rounding up for the sampler)."""
    _check_target(target)
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    if dropped < 0:
        raise ValueError(f"dropped must be >= 0, got {dropped}")
    survivors = devices - dropped
    removed = len(removed_components(devices, threshold, survivors))
    return RemovalCost(devices=devices, threshold=threshold, dim=dim, dropped=dropped,
                       device_variance=sum(exact_component_variances(devices, threshold, target), Fraction(0)),
                       d19_device_variance=target / devices, extra_seeds_per_device=devices - threshold,
                       survivors=survivors, removed_per_survivor=removed,
                       regenerated_draws=survivors * removed * dim)
