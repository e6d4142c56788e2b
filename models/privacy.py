"""Differential privacy for device updates: per-row clipping, Gaussian noise, accounting.

Pure math first (`clip_rows`, `add_gaussian_noise`, `privatize`, `epsilon`),
bookkeeping apart (`RoundAccountant`). Numeric parameters are keyword-only.
Epsilon always comes from `dp_accounting` (RDP or PLD accountant), never from
a hand-written formula.

What is done to the updates (B, update_dim) of a cohort, per device (row):
    x_b <- x_b * min(1, clip / ||x_b||_2)          (L2 clipping to `clip` = tau)
    x_b <- x_b + N(0, (noise_multiplier * clip)^2 I)  (noise std z * tau)
The noise is added on the device, before secure aggregation and before the
server sees anything (local noise).

What `epsilon` means (state this wherever it is reported):
    It is the (epsilon, delta) of the Poisson-subsampled Gaussian mechanism
    with noise multiplier z, sampling rate q = cohort size / number of users,
    composed over the rounds run, under add-or-remove-one-*device*
    adjacency (user level: all of a device's data changes at once; the
    sensitivity of one device's clipped update is tau). It bounds what the
    *sequence of aggregated updates* (and hence the global model) reveals
    about any one device. Because every device adds its own N(0, (z tau)^2)
    noise, the sum of B updates carries noise of std z*tau*sqrt(B), so the
    bound is conservative for the aggregate (it credits only one device's
    noise). Two caveats: (1) cohorts are drawn uniformly *without*
    replacement with a fixed size, and Poisson sampling at the same rate is
    the standard approximation used by TF Privacy and Opacus; with every
    device in every round (q = 1) there is no sampling and the number is
    exact for that mechanism. (2) Without secure aggregation, a server that
    sees an individual device's noisy update and knows that the device took
    part gets no amplification by sampling: that device's local guarantee
    is the same accountant with q = 1 over the rounds it took part in
    (`epsilon(..., sampling_rate=1.0, rounds=participations)`).
    With *distributed* noise (the engine's --dp-mode distributed, only with
    secure aggregation) every device adds N(0, (z tau)^2 / B): the sum the
    server unmasks carries exactly N(0, (z tau)^2), the same epsilon is then
    tight for the aggregate, assuming the devices add their share, and an
    individual update on its own is not protected. Only the devices whose
    inputs the secure sum counts contribute their share: with dropouts the
    sum carries z * sqrt(counted / B) (`distributed_noise_multiplier`), and
    the coordinator accounts each round at that multiplier, composing rounds
    of different (z, q) exactly (`composed_epsilon`).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Literal

import dp_accounting
import torch
from dp_accounting import pld, rdp

Accountant = Literal["rdp", "pld"]
DEFAULT_DELTA = 1e-5


def clip_rows(updates: torch.Tensor, *, clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale every row to L2 norm at most `clip`; returns (clipped copy, original norms)."""
    if clip <= 0:
        raise ValueError(f"clip must be > 0, got {clip}")
    if updates.dim() != 2:
        raise ValueError(f"updates must be (B, update_dim), got shape {tuple(updates.shape)}")
    norms = torch.linalg.vector_norm(updates, dim=1)
    scale = torch.clamp(clip / norms.clamp(min=1e-12), max=1.0)
    return updates * scale.unsqueeze(1), norms


def add_gaussian_noise(
    updates: torch.Tensor, *, std: float, generator: torch.Generator
) -> torch.Tensor:
    """updates + N(0, std^2) element-wise, drawn from `generator` (a new tensor)."""
    if std < 0:
        raise ValueError(f"noise std must be >= 0, got {std}")
    if std == 0 or updates.numel() == 0:
        return updates.clone()
    noise = torch.randn(updates.shape, generator=generator, device=generator.device, dtype=updates.dtype)
    return updates + noise.to(updates.device).mul_(std)


def privatize(
    updates: torch.Tensor,
    *,
    clip: float,
    noise_multiplier: float,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip every row to `clip`, then add N(0, (noise_multiplier * clip)^2).

    Returns (private updates, pre-clipping row norms)."""
    if noise_multiplier < 0:
        raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
    clipped, norms = clip_rows(updates, clip=clip)
    return add_gaussian_noise(clipped, std=noise_multiplier * clip, generator=generator), norms


def dp_event(*, noise_multiplier: float, sampling_rate: float, rounds: int) -> dp_accounting.DpEvent:
    """The DpEvent of `rounds` rounds of the Poisson-subsampled Gaussian mechanism."""
    if not 0 < sampling_rate <= 1:
        raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate}")
    if noise_multiplier <= 0:
        raise ValueError(f"noise_multiplier must be > 0 for a finite epsilon, got {noise_multiplier}")
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    one = dp_accounting.PoissonSampledDpEvent(sampling_rate, dp_accounting.GaussianDpEvent(noise_multiplier))
    return dp_accounting.SelfComposedDpEvent(one, rounds)


@contextlib.contextmanager
def _quiet_absl() -> Iterator[None]:
    # dp_accounting's RDP code logs a warning for every order it cannot evaluate.
    log = logging.getLogger("absl")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _accountant(kind: Accountant) -> dp_accounting.PrivacyAccountant:
    if kind == "rdp":
        return rdp.RdpAccountant()
    if kind == "pld":
        return pld.PLDAccountant()
    raise ValueError(f"unknown accountant {kind!r}; expected 'rdp' or 'pld'")


def epsilon(
    *,
    noise_multiplier: float,
    sampling_rate: float,
    rounds: int,
    delta: float = DEFAULT_DELTA,
    accountant: Accountant = "rdp",
) -> float:
    """Epsilon at `delta` after `rounds` rounds (see the module docstring for its meaning)."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if rounds == 0:
        return 0.0
    acc = _accountant(accountant)
    with _quiet_absl():
        acc.compose(dp_event(noise_multiplier=noise_multiplier, sampling_rate=sampling_rate, rounds=rounds))
        eps = float(acc.get_epsilon(delta))
    return eps if math.isfinite(eps) else math.inf


def distributed_noise_multiplier(noise_multiplier: float, *, planned: int, counted: int) -> float:
    """The noise multiplier the *sum* actually carries under distributed noise.

    Each of the `planned` devices adds N(0, (z tau)^2 / planned); only the
    `counted` devices whose inputs the secure sum contains contribute noise,
    so the sum carries N(0, (z tau)^2 * counted / planned): multiplier
    z * sqrt(counted / planned) <= z. Dropouts therefore weaken the round's
    guarantee, and the accountant must be given this value, not z."""
    if planned < 1 or not 0 <= counted <= planned:
        raise ValueError(f"need 0 <= counted <= planned and planned >= 1, got counted={counted}, planned={planned}")
    if noise_multiplier < 0:
        raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
    return noise_multiplier * math.sqrt(counted / planned)


def composed_epsilon(
    rounds: Sequence[tuple[float, float]],
    *,
    delta: float = DEFAULT_DELTA,
    accountant: Accountant = "rdp",
) -> float:
    """Epsilon at `delta` of rounds that may differ, each given as
    (noise_multiplier, sampling_rate) of a Poisson-subsampled Gaussian round,
    composed by the accountant (no upper-bounding by the worst round)."""
    return Composition(rounds, delta=delta, accountant=accountant).epsilon()


class Composition:
    """A running composition of rounds (z, q), for a ledger that grows by one
    round at a time: `epsilon_with(z, q)` prices one more round without
    recomposing the history, and `add` records it once it is committed.
    Identical rounds are composed as one self-composed event, so building
    from a history costs one accountant evaluation per distinct (z, q) (with
    RDP ~0.1 s each when q < 1); each later round costs one."""

    def __init__(
        self,
        rounds: Sequence[tuple[float, float]] = (),
        *,
        delta: float = DEFAULT_DELTA,
        accountant: Accountant = "rdp",
    ) -> None:
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        self.delta = delta
        self._acc = _accountant(accountant)
        self._infinite = False  # a round without noise: epsilon is infinite from then on
        self.rounds = 0
        for (z, q), n in sorted(Counter((float(z), float(q)) for z, q in rounds).items()):
            self._infinite |= self._compose(self._acc, z, q, n)
            self.rounds += n

    @staticmethod
    def _compose(acc: dp_accounting.PrivacyAccountant, z: float, q: float, n: int) -> bool:
        """Compose n rounds (z, q) into acc; True when z = 0 (epsilon infinite)."""
        if z <= 0:
            dp_event(noise_multiplier=1.0, sampling_rate=q, rounds=n)  # validates q and n
            return True
        with _quiet_absl():
            acc.compose(dp_event(noise_multiplier=z, sampling_rate=q, rounds=n))
        return False

    def _eps(self, acc: dp_accounting.PrivacyAccountant, infinite: bool, rounds: int) -> float:
        if infinite:
            return math.inf
        if rounds == 0:
            return 0.0
        with _quiet_absl():
            eps = float(acc.get_epsilon(self.delta))
        return eps if math.isfinite(eps) else math.inf

    def epsilon(self) -> float:
        """Epsilon at `delta` of the rounds added so far."""
        return self._eps(self._acc, self._infinite, self.rounds)

    def epsilon_with(self, noise_multiplier: float, sampling_rate: float) -> float:
        """Epsilon if one more round (z, q) were added; changes nothing."""
        acc = copy.deepcopy(self._acc)
        infinite = self._compose(acc, noise_multiplier, sampling_rate, 1) or self._infinite
        return self._eps(acc, infinite, self.rounds + 1)

    def add(self, noise_multiplier: float, sampling_rate: float) -> None:
        self._infinite |= self._compose(self._acc, noise_multiplier, sampling_rate, 1)
        self.rounds += 1


class RoundAccountant:
    """Bookkeeping: count rounds at a fixed noise multiplier and sampling rate."""

    def __init__(
        self,
        *,
        noise_multiplier: float,
        sampling_rate: float,
        delta: float = DEFAULT_DELTA,
        accountant: Accountant = "rdp",
    ) -> None:
        dp_event(noise_multiplier=noise_multiplier, sampling_rate=sampling_rate, rounds=0)  # validates
        _accountant(accountant)
        self.noise_multiplier = noise_multiplier
        self.sampling_rate = sampling_rate
        self.delta = delta
        self.accountant: Accountant = accountant
        self.rounds = 0

    def step(self, n: int = 1) -> None:
        self.rounds += n

    def epsilon(self) -> float:
        return epsilon(
            noise_multiplier=self.noise_multiplier,
            sampling_rate=self.sampling_rate,
            rounds=self.rounds,
            delta=self.delta,
            accountant=self.accountant,
        )
