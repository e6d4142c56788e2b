"""Epsilon as the product states it: with its delta, the unit it protects,
and what the same noise would give a production-size deployment.

The admin service (the privacy ledger and the overview the dashboard draws)
and `fedmask demo` print these; `dpmech.plan` computes them.

`production_line(z, counted)` holds the noise norm of the mean update fixed
(the model's cost: z tau sqrt(d) / counted), so a cohort B' of the
production deployment gets the multiplier z' = z B' / counted, priced as
`dpmech.plan` prices a plan (one group, the realised shares, without
amplification by sampling as the primary figure and the Poisson-sampling
assumption beside it).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from dpmech import PROTECTS
from dpmech.plan import (
    PlanRequest,
    Shares,
    epsilon_of,
    evaluate,
    geometry_for,
    multiplier_range,
    needed_scaled_clip,
    rounding_scaled_clip,
)
from dpmech.rotation import padded_dimension


@dataclass(frozen=True)
class Deployment:
    population: int
    cohort: int
    rounds: int
    delta: float


#: The production-size deployment every epsilon is put beside.
PRODUCTION = Deployment(population=1_000_000, cohort=1_000, rounds=100, delta=1e-7)


@dataclass(frozen=True)
class ProductionLine:
    """What the same noise in the mean update gives a production-size deployment."""

    deployment: Deployment
    noise_multiplier: float  # z * cohort / counted: the same noise norm in the mean update
    epsilon: float  # over the rounds, no amplification by sampling
    epsilon_if_poisson: float  # the Poisson-sampling assumption
    text: str

    def as_dict(self) -> dict[str, Any]:
        d = self.deployment
        return {"population": d.population, "cohort": d.cohort, "rounds": d.rounds, "delta": d.delta,
                "noise_multiplier": self.noise_multiplier, "epsilon": self.epsilon,
                "epsilon_if_poisson": self.epsilon_if_poisson, "text": self.text}


@functools.lru_cache(maxsize=128)
def production_line(noise_multiplier: float, counted: int, deployment: Deployment = PRODUCTION) -> ProductionLine | None:
    """The deployment's epsilon with the noise of a round whose sum of `counted`
    devices carried `noise_multiplier`, held at the same noise norm in the mean
    update (so the same cost to the model): z' = z * cohort / counted, priced
    as `plan` prices it (one group). None when there is no noise or the noise
    is beyond the exact sampler's range."""
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0 and counted >= 1):
        return None
    z = noise_multiplier * deployment.cohort / counted
    request = PlanRequest(population=deployment.population, cohort=deployment.cohort, rounds=deployment.rounds,
                          delta=deployment.delta, target_epsilon=1.0)
    scaled_clip = max(rounding_scaled_clip(padded_dimension(request.dim)), needed_scaled_clip(z, request.cohort))
    geometry = geometry_for(request, scaled_clip)
    shares = Shares.of((request.cohort,))
    if z > multiplier_range(geometry, shares)[1]:
        return None
    noise = evaluate(z, request, geometry, shares, "none")
    poisson = epsilon_of(noise.rho_round, request.rounds, request.delta, "poisson", request.sampling_rate)
    text = (f"At {deployment.population:,} devices, cohorts of {deployment.cohort:,}, {deployment.rounds} rounds, "
            f"with the same noise in the mean update (noise multiplier {z:.3g}): epsilon "
            f"{epsilon_text(noise.epsilon_total)} at delta {deployment.delta:.0e}, or {epsilon_text(poisson)} if cohorts were Poisson samples (rate "
            f"{request.sampling_rate:g}), which devices cannot check")
    return ProductionLine(deployment=deployment, noise_multiplier=z, epsilon=noise.epsilon_total,
                          epsilon_if_poisson=poisson, text=text)


def statement(epsilon: float, delta: float, rounds: int, *, amplified: bool) -> str:
    """One sentence: the epsilon, its delta, the unit it protects and whether sampling was assumed."""
    how = ("amplification by sampling assumed" if amplified
           else "no amplification by sampling (devices cannot check how cohorts are drawn)")
    return f"epsilon {epsilon_text(epsilon, 4)} at delta {delta:.0e} over {rounds} rounds protects {PROTECTS}; {how}"


def epsilon_text(epsilon: float, digits: int = 3) -> str:
    """Epsilon rounded UP to `digits` significant digits (a printed epsilon is never below the computed one)."""
    if math.isinf(epsilon):
        return "inf"
    if epsilon <= 0:
        return "0"
    unit = 10.0 ** (math.floor(math.log10(epsilon)) - digits + 1)
    up = math.ceil(epsilon / unit - 1e-9) * unit
    while up < epsilon:  # float rounding, never down
        up += unit
    return f"{up:.{digits}g}" if up < 10 ** digits else f"{up:.0f}"
