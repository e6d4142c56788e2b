"""Planning a deployment: the noise the distributed discrete Gaussian needs for a target epsilon.

`plan(PlanRequest(...))` answers, for a population of N devices, cohorts of
B, T rounds and a target (epsilon, delta): how much noise each device must
add, what epsilon that gives per round and over T rounds, and what the noise
costs the model (its noise-to-signal ratio). It is what `fedmask privacy
plan` prints; `dpmech.claims` puts every epsilon the product shows beside its
delta, its unit and a production-size deployment.

The mechanism planned is `dpmech.mechanism`'s, exactly: d coordinates padded
to d' = 2^ceil(log2 d), clip c, a scale s, the norm bound B(sc) and the
sensitivity Delta = sqrt(B) in integer units, each device's share
N_Z(0, sigma^2) with sigma^2 an exact fraction (`mechanism.local_sigma2`,
rounded up), priced by `accounting.zcdp_rho` (the sum of the counted
devices' shares, Kairouz, Liu and Steinke 2021) and composed over rounds by
`accounting.epsilon` (dp_accounting's RDP accountant).

Contracts:

- **The noise multiplier z** is the searched figure: every group's sum
  carries noise of standard deviation at least z Delta (each device adds
  sigma^2 = (z Delta)^2 / |group|, rounded up). The plan's z is the least,
  to a relative 1e-4, whose epsilon over T rounds meets the target; 1% less
  does not meet it (epsilon is non-increasing in z). Every epsilon printed
  is computed from the realised shares (the rounded-up sigma^2), never from
  z itself, so no figure is under-reported.
- **Without amplification by sampling** is the primary figure: devices
  cannot check how a cohort was drawn, and fedmask's cohorts are drawn at a
  fixed size from devices whose availability is not random. **With
  amplification** is labelled an assumption: cohorts as Poisson samples at
  rate q = B/N, each round priced as dp_accounting's Poisson-sampled
  Gaussian with the multiplier 1/sqrt(2 rho) of the round's zCDP rho (the
  Gaussian with the same rho). That step is not proved for the discrete sum;
  it is the figure a deployment would get if it trusted the sampling.
- **Groups** (D87): a cohort of B in groups of G is m = max(1, floor(B/G))
  groups of floor(B/m) or ceil(B/m) devices. Each device's share is
  calibrated to its group, a round costs its worst group's rho, and the
  summed update carries the noise of m group sums: about sqrt(m) times
  one group's (`Plan.grouping_cost`).
- **Dropouts** (D19): only counted devices' shares reach the sum. With a
  fraction p dropped from every group (floor((1 - p) n) counted), the plan's
  shares give a smaller multiplier and a larger epsilon (`Dropout`); the
  noise that keeps the target is each device adding its share for the
  counted devices (`Dropout.keep_target`).
- **The scale.** s is chosen so that rounding costs at most 1% of the
  sensitivity (Delta <= 1.01 s c) and each share's sigma is at least 2, where
  the bound's tau term is below 1e-16 (docs/privacy.md): the smallest such s,
  so the field stays small. The field needed is the smallest w whose
  overflow bound (`field.overflow_bound`, the whole cohort's sum) is below
  the target; a plan whose field is larger than the one given is refused.
- **Noise-to-signal.** The noise norm of the mean update is
  sigma_sum sqrt(d) / B' (sigma_sum the summed update's noise per
  coordinate in model units, B' the counted devices); the largest mean
  signal is c (every update of norm c, aligned). The ratio is the first over
  the second.

Refusals are `PlanError` (a ValueError) with a message that says what to
change: bad input, a target the exact sampler's range cannot reach, a field
too small.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

import dp_accounting
from dp_accounting import rdp

from dpmech import PROTECTS, accounting, exact_sampler
from dpmech import field as modular
from dpmech.mechanism import DEFAULT_OVERFLOW_TARGET, MechanismConfig, local_sigma2
from dpmech.quantize import norm_bound_sq
from dpmech.rotation import padded_dimension

#: FedRAP's update on ML-100K (1,682 items x 32), what the demo's devices send.
DEFAULT_DIM = 53_824
#: The demo's clip (tau).
DEFAULT_CLIP = 0.1
#: Secure aggregation's words are uint32.
DEFAULT_BITS = 32
ROUNDING_SLACK = 0.01  # Delta <= (1 + slack) s c
MIN_PLANNED_SIGMA = 2.0  # from sigma = 2 the bound's tau term is below 1e-16
_RELATIVE_TOLERANCE = 1e-4

Accounting = Literal["none", "poisson"]


class PlanError(ValueError):
    """A plan that cannot be made, with what to change."""


@dataclass(frozen=True)
class PlanRequest:
    """What to plan for. `group_size` None: one group (the cohort)."""

    population: int
    cohort: int
    rounds: int
    delta: float
    target_epsilon: float
    dropout: float = 0.0
    group_size: int | None = None
    dim: int = DEFAULT_DIM
    clip: float = DEFAULT_CLIP
    bits: int = DEFAULT_BITS
    overflow_target: float = DEFAULT_OVERFLOW_TARGET

    def __post_init__(self) -> None:
        for name in ("population", "cohort", "rounds", "dim"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise PlanError(f"{name} must be a whole number >= 1, got {value!r}")
        if self.cohort < 2:
            raise PlanError(f"a secure sum needs a cohort of at least 2 devices, got {self.cohort}")
        if self.cohort > self.population:
            raise PlanError(f"the cohort ({self.cohort}) cannot exceed the population ({self.population})")
        if not 0 < self.delta < 1:
            raise PlanError(f"delta must be in (0, 1), got {self.delta}")
        if not (math.isfinite(self.target_epsilon) and self.target_epsilon > 0):
            raise PlanError(f"the target epsilon must be a positive number, got {self.target_epsilon}")
        if not 0 <= self.dropout < 1:
            raise PlanError(f"the dropout fraction must be in [0, 1), got {self.dropout}")
        if self.group_size is not None and not (isinstance(self.group_size, int) and self.group_size >= 2):
            raise PlanError(f"the group size must be a whole number >= 2, got {self.group_size!r}")
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise PlanError(f"the clip must be a positive number, got {self.clip}")
        if not (isinstance(self.bits, int) and modular.MIN_BITS <= self.bits <= modular.MAX_BITS):
            raise PlanError(f"the field must have {modular.MIN_BITS} to {modular.MAX_BITS} bits, got {self.bits!r}")
        if not 0 < self.overflow_target < 1:
            raise PlanError(f"the overflow target must be in (0, 1), got {self.overflow_target}")

    @property
    def sampling_rate(self) -> float:
        return self.cohort / self.population


def group_sizes(cohort: int, group_size: int | None) -> tuple[int, ...]:
    """Every group's size, ascending (D87: m = max(1, floor(B/G)) groups of floor(B/m) or ceil(B/m))."""
    groups = 1 if group_size is None else max(1, cohort // group_size)
    base, extra = divmod(cohort, groups)
    return tuple([base] * (groups - extra) + [base + 1] * extra)


@dataclass(frozen=True)
class Geometry:
    """The mechanism's fixed part: dimensions, clip, scale, sensitivity."""

    dim: int
    clip: float
    scaled_clip: float  # C = s c, integer units
    padded_dim: int = field(init=False)
    bound_sq: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "padded_dim", padded_dimension(self.dim))
        object.__setattr__(self, "bound_sq", norm_bound_sq(self.scaled_clip, self.padded_dim))

    @property
    def scale(self) -> float:
        return self.scaled_clip / self.clip

    @property
    def sensitivity(self) -> float:
        return accounting.sensitivities(self.bound_sq, self.padded_dim)[0]


@dataclass(frozen=True)
class Shares:
    """Who calibrates and who is counted: per group, (size, devices its
    shares are calibrated to, devices counted in its sum)."""

    groups: tuple[tuple[int, int, int], ...]

    @classmethod
    def of(cls, sizes: tuple[int, ...], *, calibrate: Callable[[int], int] = int,
           counted: Callable[[int], int] = int) -> Shares:
        return cls(tuple((n, calibrate(n), counted(n)) for n in sizes))

    def distinct(self) -> tuple[tuple[int, int, int], ...]:
        return tuple(sorted(set(self.groups)))

    def sigma2(self, z: float, geometry: Geometry) -> dict[int, Fraction]:
        """Each device's sigma^2 at multiplier z, by its group's size."""
        return {n: local_sigma2(z, geometry.sensitivity, c) for n, c, _ in self.distinct()}


@dataclass(frozen=True)
class Noise:
    """The noise at one multiplier, and what it gives."""

    noise_multiplier: float  # z: each group's sum carries >= z Delta (before dropouts)
    sum_multiplier: float  # the worst group's realised sqrt(counted sigma^2) / Delta
    device_sigma2: dict[int, Fraction]  # each device's sigma^2, integer units, by its group's size
    device_sigma: float  # the largest share's sigma, integer units
    device_sigma_model: float  # the same in model units (/ s)
    sum_sigma_model: float  # the summed update's noise std per coordinate, model units
    noise_norm_of_mean: float  # sum_sigma_model sqrt(d) / counted devices
    noise_to_signal: float  # noise_norm_of_mean / c
    rho_round: float
    epsilon_round: float
    epsilon_total: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "noise_multiplier": self.noise_multiplier, "sum_multiplier": self.sum_multiplier,
            "device_sigma": self.device_sigma, "device_sigma_model_units": self.device_sigma_model,
            "device_sigma2_by_group_size": {str(n): str(s) for n, s in sorted(self.device_sigma2.items())},
            "sum_sigma_model_units": self.sum_sigma_model, "noise_norm_of_mean": self.noise_norm_of_mean,
            "noise_to_signal": self.noise_to_signal, "rho_per_round": self.rho_round,
            "epsilon_per_round": self.epsilon_round, "epsilon_total": self.epsilon_total,
        }


def _poisson_gaussian_epsilon(rho: float, rate: float, rounds: int, delta: float) -> float:
    """The assumption's figure: T rounds of the Gaussian with zCDP rho, each
    on a Poisson sample at `rate`, by dp_accounting's RDP accountant."""
    if rho == 0:
        return 0.0
    gaussian = dp_accounting.GaussianDpEvent(1 / math.sqrt(2 * rho))
    event: dp_accounting.DpEvent = gaussian if rate >= 1 else dp_accounting.PoissonSampledDpEvent(rate, gaussian)
    # dp_accounting logs a warning for each order it cannot evaluate and leaves that order out: the
    # minimum over the others is still an upper bound
    log = logging.getLogger("absl")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        accountant = rdp.RdpAccountant()
        accountant.compose(dp_accounting.SelfComposedDpEvent(event, rounds))
        eps = float(accountant.get_epsilon(delta))
    finally:
        log.setLevel(level)
    return eps if math.isfinite(eps) else math.inf


def epsilon_of(rho: float, rounds: int, delta: float, how: Accounting, rate: float) -> float:
    if how == "none":
        return accounting.epsilon([rho] * rounds, delta)
    return _poisson_gaussian_epsilon(rho, rate, rounds, delta)


def _round_rho(z: float, geometry: Geometry, shares: Shares) -> tuple[float, dict[int, Fraction]]:
    sigma2 = shares.sigma2(z, geometry)
    l2, l1 = accounting.sensitivities(geometry.bound_sq, geometry.padded_dim)
    rhos = [accounting.zcdp_rho(l2=l2, l1=l1, devices=counted, sigma2=sigma2[n], padded_dim=geometry.padded_dim)
            for n, _, counted in shares.distinct()]
    return accounting.round_rho(rhos), sigma2


def evaluate(z: float, request: PlanRequest, geometry: Geometry, shares: Shares, how: Accounting) -> Noise:
    """The noise at multiplier z and what it gives (`how`: no amplification, or the Poisson assumption)."""
    rho, sigma2 = _round_rho(z, geometry, shares)
    rate = request.sampling_rate
    delta = request.delta
    counted_var = math.fsum(counted * float(sigma2[n]) for n, _, counted in shares.groups)
    counted_total = sum(counted for _, _, counted in shares.groups)
    sum_sigma = math.sqrt(counted_var) / geometry.scale
    noise_norm = sum_sigma * math.sqrt(request.dim) / counted_total
    largest = max(sigma2.values())
    return Noise(
        noise_multiplier=z,
        sum_multiplier=min(math.sqrt(counted * float(sigma2[n])) for n, _, counted in shares.groups)
        / geometry.sensitivity,
        device_sigma2=sigma2, device_sigma=math.sqrt(largest), device_sigma_model=math.sqrt(largest) / geometry.scale,
        sum_sigma_model=sum_sigma, noise_norm_of_mean=noise_norm, noise_to_signal=noise_norm / request.clip,
        rho_round=rho, epsilon_round=epsilon_of(rho, 1, delta, how, rate),
        epsilon_total=epsilon_of(rho, request.rounds, delta, how, rate))


@functools.cache
def sampler_max_sigma2() -> int:
    """The largest whole sigma^2 the exact int64 sampler draws (`exact_sampler.check_variance`)."""
    lo, hi = 1, 1 << 32  # check_variance accepts lo, refuses hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            exact_sampler.check_variance(Fraction(mid))
            lo = mid
        except ValueError:
            hi = mid
    return lo


def multiplier_range(geometry: Geometry, shares: Shares) -> tuple[float, float]:
    """(z_floor, z_ceiling): below z_floor every share is at sigma = 1/2 (the
    least the bound allows); above z_ceiling some share leaves the exact
    sampler's range."""
    calibrated = [c for _, c, _ in shares.distinct()]
    floor = math.sqrt(min(calibrated) / 4) / geometry.sensitivity
    ceiling = math.sqrt(min(calibrated) * (sampler_max_sigma2() - 1)) / geometry.sensitivity
    return floor, ceiling


def least_multiplier(request: PlanRequest, geometry: Geometry, shares: Shares, how: Accounting) -> float:
    """The least z (to a relative 1e-4) whose epsilon over the rounds meets the target."""
    def meets(z: float) -> bool:
        rho, _ = _round_rho(z, geometry, shares)
        return epsilon_of(rho, request.rounds, request.delta, how, request.sampling_rate) <= request.target_epsilon

    z_floor, z_ceiling = multiplier_range(geometry, shares)
    if meets(z_floor):
        return z_floor
    hi = max(2 * z_floor, 1.0)
    while not meets(hi):
        if hi >= z_ceiling:
            raise PlanError(
                f"epsilon {request.target_epsilon:g} over {request.rounds} rounds at delta {request.delta:g} is out "
                f"of reach: it needs a noise multiplier above {z_ceiling:.4g}, and each device's share would then "
                f"need sigma above {math.sqrt(sampler_max_sigma2()):.0f} integer units, beyond the exact sampler's "
                "range. Plan for a larger cohort (each device adds less), fewer rounds or a larger target epsilon")
        hi = min(2 * hi, z_ceiling)
    lo = max(hi / 2, z_floor)
    while meets(lo):
        hi, lo = lo, max(lo / 2, z_floor)
    while hi / lo > 1 + _RELATIVE_TOLERANCE:
        mid = math.sqrt(lo * hi)
        if meets(mid):
            hi = mid
        else:
            lo = mid
    return hi


# ------------------------------------------------------------------ the scale


def rounding_scaled_clip(padded_dim: int) -> float:
    """The least C (to 0.1%) with sqrt(B(C)) <= (1 + ROUNDING_SLACK) C: from
    there on, rounding costs at most 1% of the sensitivity."""
    def fits(c: float) -> bool:
        return math.sqrt(norm_bound_sq(c, padded_dim)) <= (1 + ROUNDING_SLACK) * c

    lo, hi = 1.0, 2.0
    while not fits(hi):
        lo, hi = hi, 2 * hi
    while hi / lo > 1.001:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def geometry_for(request: PlanRequest, scaled_clip: float) -> Geometry:
    """The geometry with scale s = C / c rounded up to 3 significant digits (a figure to configure)."""
    raw = scaled_clip / request.clip
    unit = 10.0 ** (math.floor(math.log10(raw)) - 2)
    scale = math.ceil(raw / unit) * unit
    return Geometry(dim=request.dim, clip=request.clip, scaled_clip=scale * request.clip)


def needed_scaled_clip(z: float, largest_group: int) -> float:
    """C at which a share calibrated to `largest_group` devices at multiplier z has sigma >= MIN_PLANNED_SIGMA
    (sigma = z Delta / sqrt(n) >= z C / sqrt(n))."""
    return MIN_PLANNED_SIGMA * math.sqrt(largest_group) / z


# ------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Dropout:
    """A fraction of every group dropped (D19: only counted shares reach the sum)."""

    fraction: float
    counted: tuple[int, ...]  # per group
    with_plan_noise: Noise  # the plan's shares; epsilon and noise as they reach the sum
    keep_target: Noise  # each device's share calibrated to its group's counted devices


@dataclass(frozen=True)
class Plan:
    """What `plan` found: the mechanism's geometry, the noise both ways, dropouts, groups and the field."""

    request: PlanRequest
    groups: tuple[int, ...]
    geometry: Geometry
    primary: Noise  # no amplification by sampling
    amplified: Noise  # the Poisson-sampling assumption
    primary_if_poisson: float  # epsilon over the rounds with the primary noise, under the assumption
    dropout: Dropout | None
    grouping_cost: float | None  # the summed update's noise against one group's at the same z
    bits_needed: int
    overflow_probability: float  # at request.bits, the largest shares planned

    def as_dict(self) -> dict[str, Any]:
        r, g = self.request, self.geometry
        drop = self.dropout
        return {
            "request": {"population": r.population, "cohort": r.cohort, "rounds": r.rounds, "delta": r.delta,
                        "target_epsilon": r.target_epsilon, "dropout": r.dropout, "group_size": r.group_size,
                        "dim": r.dim, "clip": r.clip, "bits": r.bits, "overflow_target": r.overflow_target},
            "protects": PROTECTS,
            "mechanism": {"padded_dim": g.padded_dim, "scale": g.scale, "scaled_clip": g.scaled_clip,
                          "bound_sq": g.bound_sq, "sensitivity": g.sensitivity, "groups": list(self.groups),
                          "bits_needed": self.bits_needed, "overflow_probability": self.overflow_probability},
            "without_amplification": self.primary.as_dict(),
            "with_amplification": {"assumption": POISSON_ASSUMPTION, "sampling_rate": r.sampling_rate,
                                   **self.amplified.as_dict()},
            "primary_noise_epsilon_if_poisson": self.primary_if_poisson,
            "dropout": None if drop is None else {
                "fraction": drop.fraction, "counted_by_group": list(drop.counted),
                "with_plan_noise": drop.with_plan_noise.as_dict(), "keep_target": drop.keep_target.as_dict()},
            "grouping": None if self.grouping_cost is None else {
                "groups": len(self.groups), "noise_against_one_group": self.grouping_cost},
        }


POISSON_ASSUMPTION = ("cohorts are Poisson samples of the population at rate cohort/population, each round priced "
                      "as the Poisson-sampled Gaussian with the round's zCDP rho; devices cannot check this")


def counted_after(n: int, dropout: float) -> int:
    """The devices a group of n counts when a fraction `dropout` of it drops (at least 1)."""
    return max(1, n - math.ceil(round(n * dropout, 9)))


def plan(request: PlanRequest) -> Plan:
    """The plan (module doc); PlanError when it cannot be made."""
    sizes = group_sizes(request.cohort, request.group_size)
    full = Shares.of(sizes)
    scaled_clip = rounding_scaled_clip(padded_dimension(request.dim))
    # raise the scale until every planned share has sigma >= 2 (usually at once); the accounting is exact
    # either way, sigma >= 2 only keeps the bound's tau term from costing noise
    for _ in range(4):
        geometry = geometry_for(request, scaled_clip)
        primary_z = least_multiplier(request, geometry, full, "none")
        # a larger scale only needs a larger field: refuse a field too small before the slow search
        _field(request, geometry, max(full.sigma2(primary_z, geometry).values()))
        amplified_z = least_multiplier(request, geometry, full, "poisson")
        needed = needed_scaled_clip(min(primary_z, amplified_z), max(sizes))
        if needed <= geometry.scaled_clip:
            break
        scaled_clip = needed
    primary = evaluate(primary_z, request, geometry, full, "none")
    amplified = evaluate(amplified_z, request, geometry, full, "poisson")
    dropout = _dropout(request, geometry, sizes, primary_z) if request.dropout > 0 else None
    largest = max([*primary.device_sigma2.values(), *(dropout.keep_target.device_sigma2.values() if dropout else ())])
    bits = _field(request, geometry, largest)
    grouping = None
    if len(sizes) > 1:
        one = local_sigma2(primary_z, geometry.sensitivity, request.cohort)
        grouping = primary.sum_sigma_model / (math.sqrt(request.cohort * float(one)) / geometry.scale)
    return Plan(request=request, groups=sizes, geometry=geometry, primary=primary, amplified=amplified,
                primary_if_poisson=epsilon_of(primary.rho_round, request.rounds, request.delta, "poisson",
                                            request.sampling_rate),
                dropout=dropout, grouping_cost=grouping, bits_needed=bits,
                overflow_probability=modular.overflow_bound(request.cohort, geometry.scaled_clip, geometry.padded_dim,
                                                            float(largest), request.bits))


def _dropout(request: PlanRequest, geometry: Geometry, sizes: tuple[int, ...], z: float) -> Dropout:
    def kept(n: int) -> int:
        return counted_after(n, request.dropout)

    keep_shares = Shares.of(sizes, calibrate=kept, counted=kept)
    keep_z = least_multiplier(request, geometry, keep_shares, "none")
    return Dropout(fraction=request.dropout, counted=tuple(kept(n) for n in sizes),
                   with_plan_noise=evaluate(z, request, geometry, Shares.of(sizes, counted=kept), "none"),
                   keep_target=evaluate(keep_z, request, geometry, keep_shares, "none"))


def _field(request: PlanRequest, geometry: Geometry, sigma2: Fraction) -> int:
    """The bits the whole cohort's sum needs with shares of at most sigma2; PlanError when more than given."""
    need = modular.smallest_bits(request.cohort, geometry.scaled_clip, geometry.padded_dim, float(sigma2),
                                 request.overflow_target)
    if need is None or need > request.bits:
        what = f"w >= {need} bits" if need is not None else "more than 62 bits"
        raise PlanError(
            f"a field of 2^{request.bits} is too small: the sum of {request.cohort} devices' vectors (scaled clip "
            f"{geometry.scaled_clip:.4g} in {geometry.padded_dim} coordinates, shares of sigma^2 up to "
            f"{float(sigma2):.4g}) would wrap with probability above {request.overflow_target:g}; it needs {what} "
            "(--bits), or a smaller cohort")
    try:  # the mechanism's own checks, on the configuration a deployment would run
        MechanismConfig(dim=request.dim, clip=request.clip, scale=geometry.scale, sigma2=sigma2, bits=request.bits,
                        devices=request.cohort, overflow_target=request.overflow_target)
    except ValueError as exc:
        raise PlanError(f"the planned mechanism is refused: {exc}") from None
    return need
