"""`fedmask audit`'s run: a simulated federation with canary devices (D92).

What is real and what is simulated:

- REAL: each round's aggregation is the simulator's own code path for DP,
  called as `fedmask simulate` calls it: under the discrete Gaussian
  `models.sim.dp_mechanism.discrete_gaussian_round` (L2 clip, rotation,
  scaling, rounding under the norm bound, each device's integer noise
  share, the sum mod 2^32, optionally through the in-process SecAgg(+)
  round, decoding), under `gaussian-float` `models.sim.dp_groups.
  privatize_in_groups` and the sum. The accountant's epsilon is the
  simulator's ledger (`models.sim.dp_groups.PrivacyLedger`) fed with the
  entries those rounds return.
- SIMULATED: the ordinary devices' updates are synthetic (no model is
  trained): device i's update in a round is a random direction made of a
  direction shared by the population, its own fixed direction and fresh
  per-round noise, with a norm between 0.5 and 1.5 times the clip (so some
  are clipped). The noise shares come from the simulator's seeded sampler,
  the same law as a device's CSPRNG sampler (tests/models/test_sim_dp_mechanism.py).

Canaries (Andrew et al., "One-shot Empirical Privacy Estimation for
Federated Learning", ICLR 2024): `canaries` directions uniform on the
sphere, each the update of one canary device in EVERY round, scaled to the
clip (the largest influence a device may have); as many more directions are
drawn and never inserted. The release the auditor sees is every round's
decoded sum; with every canary in every round the adversary's best linear
statistic for a canary is its projection on the sum of the releases (the
noise being isotropic), so the cosine with the final model delta is used.
`dpmech.audit.estimate` turns the two sets of cosines into an epsilon.

The seam `share_sampler` is for tests only (`discrete_gaussian_round`'s
contract): nothing a user sets reaches it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from dpmech import audit, fast_sampler
from models.registry import ConfigError
from models.sim.config import DPMechanism, DPSettings
from models.sim.aggregation import SecureAggregator
from models.sim.dp_mechanism import ShareSampler

#: What a round reports to the caller: (rounds done, rounds in all).
RoundDone = Callable[[int, int], None]
Fit = Literal["pooled", "separate"]
FITS: dict[str, Fit] = {"pooled": "pooled", "separate": "separate"}
Sampler = Literal["seeded", "exact"]
SAMPLERS: dict[str, Sampler] = {"seeded": "seeded", "exact": "exact"}
MECHANISMS: dict[str, DPMechanism] = {"discrete-gaussian": "discrete-gaussian", "gaussian-float": "gaussian-float"}
_SHARED_WEIGHT = 0.5  # the population's shared direction in an ordinary device's update


@dataclass(frozen=True)
class AuditSettings:
    """One audit run. Checked when made (ConfigError names what to change)."""

    # the mechanism under audit: the shipped round's, its noise multiplier, L2 clip and delta
    mechanism: DPMechanism = "discrete-gaussian"
    noise: float = 1.0
    clip: float = 0.1
    delta: float = 1e-5
    sampler: Sampler = "seeded"
    secagg: bool = False
    # the simulated federation: devices, the cohort of every round, rounds, update length
    population: int = 100
    cohort: int = 20
    rounds: int = 4
    dim: int = 16_384
    seed: int = 0
    # the estimate: its fit, the canaries inserted (as many held out), its interval
    fit: Fit = "pooled"
    canaries: int = 1000
    confidence: float = 0.95
    resamples: int = 1000

    def __post_init__(self) -> None:
        checks = (
            (self.dim >= 2, f"--dim must be >= 2, got {self.dim}"),
            (self.population >= 1, f"--population must be >= 1, got {self.population}"),
            (1 <= self.cohort <= self.population, f"--cohort must be in 1..{self.population} (the population), "
                                                  f"got {self.cohort}"),
            (self.canaries >= 10, f"--canaries must be >= 10 (a Gaussian is fitted to them), got {self.canaries}"),
            (self.rounds >= 1, f"--rounds must be >= 1, got {self.rounds}"),
            (math.isfinite(self.noise) and self.noise > 0, f"--noise must be > 0, got {self.noise}"),
            (math.isfinite(self.clip) and self.clip > 0, f"--clip must be > 0, got {self.clip}"),
            (0 < self.delta < 1, f"--delta must be in (0, 1), got {self.delta}"),
            (self.mechanism in ("discrete-gaussian", "gaussian-float"),
             f"--mechanism must be discrete-gaussian or gaussian-float, got {self.mechanism!r}"),
            (not (self.secagg and self.mechanism != "discrete-gaussian"),
             "--secagg audits the discrete Gaussian's residues; use it with --mechanism discrete-gaussian"),
            (self.sampler in ("seeded", "exact"), f"--sampler must be seeded or exact, got {self.sampler!r}"),
            (not (self.sampler == "exact" and (self.secagg or self.mechanism != "discrete-gaussian")),
             "--sampler exact runs the devices' encode of the discrete Gaussian, summed in the clear: without "
             "--secagg and with --mechanism discrete-gaussian"),
            (0 < self.confidence < 1, f"--confidence must be in (0, 1), got {self.confidence}"),
            (self.resamples >= 10, f"--resamples must be >= 10, got {self.resamples}"),
            (self.fit in ("pooled", "separate"), f"--fit must be pooled or separate, got {self.fit!r}"),
        )
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    def dp(self) -> DPSettings:
        return DPSettings(noise=self.noise, clip=self.clip, delta=self.delta, accountant="rdp", mode="distributed",
                          mechanism=self.mechanism)


@dataclass(frozen=True)
class AuditResult:
    """The run's empirical epsilon beside the accountant's for the same run."""

    settings: AuditSettings
    empirical: audit.EmpiricalEpsilon
    reported_epsilon: float
    noise_multiplier_priced: float  # the smallest per-round multiplier the ledger priced
    sum_noise_measured: float  # the RMS noise of the rounds' sums over the clip (mean over rounds)
    wall_s: float

    @property
    def verdict(self) -> audit.Verdict:
        return self.empirical.verdict(self.reported_epsilon)

    @property
    def crosstalk(self) -> float:
        """The other canaries' share of a cosine's spread, relative to the
        noise's: (k - 1) T / (d z^2). Large, it dilutes the estimate (D92)."""
        s = self.settings
        return (s.canaries - 1) * s.rounds / (s.dim * s.noise ** 2)

    def as_dict(self) -> dict[str, Any]:
        return {"settings": dataclasses.asdict(self.settings), "empirical": self.empirical.as_dict(),
                "reported_epsilon": self.reported_epsilon, "verdict": self.verdict.value,
                "noise_multiplier_priced": self.noise_multiplier_priced, "crosstalk": self.crosstalk,
                "sum_noise_measured": self.sum_noise_measured, "wall_s": self.wall_s}


class _Population:
    """The ordinary devices' synthetic updates (see the module doc)."""

    def __init__(self, s: AuditSettings, rng: np.random.Generator) -> None:
        self.settings, self.rng = s, rng
        self.shared = audit.random_directions(rng, 1, s.dim)[0]
        self.own = audit.random_directions(rng, s.population, s.dim)

    def updates(self) -> np.ndarray:
        """A round's updates of its cohort (drawn without replacement), rows (cohort, dim)."""
        s = self.settings
        cohort = np.sort(self.rng.choice(s.population, size=s.cohort, replace=False))
        fresh = audit.random_directions(self.rng, s.cohort, s.dim)
        raw = _SHARED_WEIGHT * self.shared + self.own[cohort] + 0.5 * fresh
        norms = s.clip * self.rng.uniform(0.5, 1.5, size=(s.cohort, 1))
        rows: np.ndarray = raw / np.linalg.norm(raw, axis=1, keepdims=True) * norms
        return rows


def _devices_round(updates: torch.Tensor, s: AuditSettings, round_idx: int) -> tuple[torch.Tensor, dict[str, Any]]:
    """`--sampler exact`: every device's vector is the devices' own
    `dpmech.mechanism.encode` (noise from the OS CSPRNG, sampled exactly),
    with the simulator's round mechanism and rotation seed; the server adds
    them mod 2^w and decodes (`dpmech.mechanism.decode_sum`)."""
    from dpmech import field as modular
    from dpmech.mechanism import decode_sum, encode
    from models.sim.dp_mechanism import privacy_entry, round_mechanisms, rotation_seed

    dp = s.dp()
    groups = (tuple(range(updates.shape[0])),)
    (config,) = round_mechanisms(dp, s.dim, groups)
    key = rotation_seed(s.seed, round_idx)
    rng = np.random.default_rng([s.seed, 92, round_idx])
    x = updates.numpy()
    total = np.zeros(config.padded_dim, dtype=np.int64)
    for row in x:
        total = modular.wrap(total + encode(row, config, key, rng), config.bits)
    decoded = decode_sum(total, config, key)
    entry = privacy_entry(dp, groups, (config,))
    clipped = x * np.minimum(1.0, s.clip / np.maximum(np.linalg.norm(x, axis=1), 1e-300))[:, None]
    entry["sum_noise_multiplier_measured"] = float(np.sqrt(np.mean((decoded - clipped.sum(axis=0)) ** 2)) / s.clip)
    return torch.as_tensor(decoded), entry


def _round_sum(updates: torch.Tensor, s: AuditSettings, round_idx: int, share_sampler: ShareSampler | None,
               secure: SecureAggregator | None) -> tuple[torch.Tensor, dict[str, Any]]:
    """The decoded sum the server releases in round `round_idx`, and its ledger entry."""
    dp = s.dp()
    groups: tuple[tuple[int, ...], ...] = (tuple(range(updates.shape[0])),)
    if s.sampler == "exact":
        return _devices_round(updates, s, round_idx)
    if s.mechanism == "discrete-gaussian":
        from models.sim.dp_mechanism import discrete_gaussian_round

        if secure is not None:
            groups = secure.partition(updates.shape[0], round_idx)
        total, _, entry, _ = discrete_gaussian_round(updates, dp=dp, groups=groups, seed=s.seed, round_idx=round_idx,
                                                     secure=secure,
                                                     share_sampler=share_sampler or fast_sampler.discrete_gaussian)
        return total, entry
    from models.sim.dp_groups import privatize_in_groups

    generator = torch.Generator().manual_seed(s.seed * 1_000_003 + round_idx)
    noisy, _, entry = privatize_in_groups(updates, dp=dp, groups=groups, generator=generator)
    return noisy.sum(0), entry


def run_audit(s: AuditSettings, *, on_round: RoundDone | None = None,
              share_sampler: ShareSampler | None = None) -> AuditResult:
    """Run the federation with its canaries and estimate epsilon (module doc).
    `share_sampler`: tests only (a fault the audit must catch)."""
    import time

    from models.sim.dp_groups import PrivacyLedger

    if share_sampler is not None and (s.mechanism != "discrete-gaussian" or s.sampler != "seeded"):
        raise ValueError("share_sampler replaces the simulator's discrete Gaussian shares; this run draws none")
    start = time.monotonic()
    rng = np.random.default_rng([s.seed, 92])
    directions = audit.random_directions(rng, 2 * s.canaries, s.dim)
    inserted, held_out = directions[:s.canaries], directions[s.canaries:]
    canary_updates = torch.as_tensor(inserted * s.clip, dtype=torch.float64)
    population = _Population(s, rng)
    secure: SecureAggregator | None = None
    if s.secagg:
        secure = SecureAggregator(seed=s.seed, neighbors="auto")
    ledger = PrivacyLedger(s.dp(), sampling_rate=1.0)  # canaries are in every round
    release = np.zeros(s.dim)
    measured = []
    for round_idx in range(s.rounds):
        updates = torch.cat([torch.as_tensor(population.updates(), dtype=torch.float64), canary_updates])
        total, entry = _round_sum(updates, s, round_idx, share_sampler, secure)
        ledger.add(entry)
        measured.append(float(entry["sum_noise_multiplier_measured"]))
        release += total.to(torch.float64).numpy()
        if on_round is not None:
            on_round(round_idx + 1, s.rounds)
    found = audit.estimate(audit.cosines(release, inserted), audit.cosines(release, held_out), delta=s.delta,
                           rng=rng, confidence=s.confidence, resamples=s.resamples,
                           equal_variances=s.fit == "pooled")
    return AuditResult(settings=s, empirical=found, reported_epsilon=ledger.epsilon(),
                       noise_multiplier_priced=min(ledger.multipliers), sum_noise_measured=float(np.mean(measured)),
                       wall_s=time.monotonic() - start)


__all__ = ["FITS", "MECHANISMS", "SAMPLERS", "AuditResult", "AuditSettings", "RoundDone", "run_audit"]
