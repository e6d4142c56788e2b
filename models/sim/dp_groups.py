"""Device-side DP of a simulated round whose secure sum runs in groups, and
the run's privacy ledger (D87).

Parallel composition. A device's update enters exactly one group's sum, and
the server learns each group's sum. Changing one device changes one group's
sum only, so a round releases, about any one device, what its group's sum
releases: the round's guarantee is that of its worst group, the one whose
sum carries the least noise. Rounds then compose as before
(`models.privacy.Composition`).

What each device adds (`privatize_in_groups`), for a clip tau and a noise
multiplier z:
- local: N(0, (z tau)^2) each, whatever its group; every group's sum is
  credited with z (one device's noise: conservative, as without groups);
- distributed: N(0, (z tau)^2 / |g|) for a device in group g, so that each
  group's sum carries exactly N(0, (z tau)^2), the noise of multiplier z
  (with counted < |g| devices in the sum: z sqrt(counted / |g|),
  `models.privacy.distributed_noise_multiplier`). The share is calibrated to
  the group, not the cohort: a cohort-wide share z / sqrt(B) would leave each
  group's sum, which the server sees, with only z sqrt(|g| / B).

The cost: with m groups the model's summed update carries m independent
N(0, (z tau)^2), i.e. noise of multiplier z sqrt(m) instead of z, sqrt(m)
times the noise of one secure sum over the whole cohort, for the same
epsilon. Each round's entry records the measured multiplier of the noise in
the summed update (`sum_noise_multiplier_measured`) beside that expectation.

`PrivacyLedger` keeps one entry per round: one line per group (size,
counted, the multiplier its sum carries), the round's multiplier (the
least), the epsilon of that round alone, and composes the rounds at the
end, without amplification by sampling (the float path also gives the
figure that assumes Poisson sampling, labelled so). One group per round at
multiplier z gives exactly the epsilon of the fixed-z accountant at q = 1.
Under the discrete Gaussian (D88) the entries come from
`models.sim.dp_mechanism` and the same ledger composes them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from models import privacy
from models.privacy import Composition, distributed_noise_multiplier
from models.sim.config import DPSettings


def device_multipliers(dp: DPSettings, groups: Sequence[Sequence[int]], devices: int) -> np.ndarray:
    """Each device's noise multiplier (see the module doc): z with local noise
    (or one group of all B, z / sqrt(B) distributed), else z / sqrt(|g|) for
    a device in group g. ValueError unless `groups` cover 0..devices-1 once."""
    if sorted(r for g in groups for r in g) != list(range(devices)):
        raise ValueError(f"the groups must cover the {devices} rows exactly once")
    out = np.full(devices, float(dp.noise))
    if dp.mode == "distributed":
        for g in groups:
            out[list(g)] = dp.noise / math.sqrt(len(g))
    return out


def privatize_rows(rows: torch.Tensor, multipliers: Sequence[float] | np.ndarray, *, clip: float,
                   generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Each row clipped to `clip` and noised on its own, in row order: row i
    takes the generator's next D normals at `multipliers[i]`
    (`models.privacy.privatize` of that row). The same rows in the same
    order give the same draws however they are cut into calls, which is
    what lets a chunked round and the whole table agree bit for bit.
    Returns (private rows, pre-clipping norms)."""
    noisy = torch.empty_like(rows)
    norms = rows.new_empty(rows.shape[0])
    for i in range(rows.shape[0]):
        noisy[i : i + 1], norms[i : i + 1] = privacy.privatize(
            rows[i : i + 1], clip=clip, noise_multiplier=float(multipliers[i]), generator=generator)
    return noisy, norms


def group_order(groups: Sequence[Sequence[int]]) -> np.ndarray:
    """The rows group after group: the order the devices draw their noise in."""
    return np.fromiter((p for g in groups for p in g), dtype=np.int64, count=sum(len(g) for g in groups))


def privatize_in_groups(
    updates: torch.Tensor,
    *,
    dp: DPSettings,
    groups: Sequence[Sequence[int]],
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Clip every row of the (B, D) updates to tau and add each device's
    noise (see the module doc); `groups` lists the rows of each group and
    covers 0..B-1. The rows draw in `group_order`, one at a time
    (`privatize_rows`): the draws of `FloatGaussianSum` fed the same rows.
    Returns (private updates, pre-clipping norms, the round's ledger entry)."""
    B = updates.shape[0]
    mult = device_multipliers(dp, groups, B)
    order = torch.as_tensor(group_order(groups), device=updates.device)
    noisy = torch.empty_like(updates)
    norms = updates.new_empty(B)
    noisy[order], norms[order] = privatize_rows(updates[order], mult[order.cpu().numpy()], clip=dp.clip,
                                                generator=generator)  # fmt: skip
    entry = round_entry(dp, groups)
    entry["sum_noise_multiplier_measured"] = _sum_noise(updates, noisy, norms, dp.clip)
    return noisy, norms, entry


def round_entry(dp: DPSettings, groups: Sequence[Sequence[int]]) -> dict[str, Any]:
    """The round's ledger entry under the float Gaussian, every device counted
    (the measured multiplier is the caller's to add)."""
    z, B = dp.noise, sum(len(g) for g in groups)
    if dp.mode == "local":
        carried, expected = [z] * len(groups), z * math.sqrt(B)
    else:
        carried = [distributed_noise_multiplier(z, planned=len(g), counted=len(g)) for g in groups]
        expected = z * math.sqrt(len(groups))
    return {
        "mode": dp.mode,
        "groups": [{"size": len(g), "counted": len(g), "noise_multiplier": c} for g, c in zip(groups, carried, strict=True)],
        "noise_multiplier": min(carried),
        "sum_noise_multiplier_expected": expected,
    }


def _sum_noise(updates: torch.Tensor, noisy: torch.Tensor, norms: torch.Tensor, clip: float) -> float:
    """The noise in the summed update, as a multiplier of tau: the RMS over
    coordinates of sum(noisy) - sum(clipped), over tau (the clipped rows'
    sum from the norms: row b scaled by min(1, tau / norm_b))."""
    if updates.shape[1] == 0:
        return 0.0
    scale = torch.clamp(clip / norms.clamp(min=1e-12), max=1.0).to(updates.dtype)
    noise = noisy.sum(0) - scale @ updates
    return float(noise.double().pow(2).mean().sqrt()) / clip


class PrivacyLedger:
    """A run's rounds, each at the multiplier of its worst group; `epsilon()`
    composes them all WITHOUT amplification by sampling (q = 1): the
    simulator's cohort is a fixed-size draw, not the Poisson sample the
    amplification theorems assume, and a device cannot check how it was
    drawn. With the float Gaussian, `epsilon_poisson_amplified()` also
    composes them at q = cohort / population, the figure that assumes Poisson
    sampling (labelled so wherever it is shown). With the discrete Gaussian
    (D88) a round's multiplier is 1 / sqrt(2 rho) of its zCDP bound, composed
    as that bound under RDP, and no amplified figure is given: its subsampled
    Renyi curve is not the Gaussian's."""

    def __init__(self, dp: DPSettings, sampling_rate: float) -> None:
        self.dp = dp
        self.sampling_rate = sampling_rate
        self.multipliers: list[float] = []
        self._single: dict[float, float] = {}  # epsilon of one round at a multiplier

    @property
    def rounds(self) -> list[tuple[float, float]]:
        """(multiplier, q = 1) of every round recorded, as composed."""
        return [(z, 1.0) for z in self.multipliers]

    def add(self, entry: dict[str, Any] | None) -> dict[str, Any]:
        """Record a round from its entry (`privatize_in_groups` or
        `models.sim.dp_mechanism.privacy_entry`; None: a round without one,
        counted at the configured multiplier); returns the entry with the
        round's `epsilon_round` (no amplification) added."""
        out = dict(entry) if entry is not None else {"mode": self.dp.mode, "noise_multiplier": self.dp.noise}
        z = float(out["noise_multiplier"])
        if z not in self._single:
            self._single[z] = self._compose([(z, 1.0)])
        out["epsilon_round"] = self._single[z]
        self.multipliers.append(z)
        return out

    def epsilon(self) -> float:
        """Epsilon at the run's delta of every round recorded, without
        amplification by sampling (math.inf once a round added no noise)."""
        return self._compose(self.rounds)

    def epsilon_poisson_amplified(self) -> float | None:
        """Epsilon at q = cohort / population, ASSUMING Poisson sampling
        (float Gaussian only; None with the discrete Gaussian or q = 1)."""
        if self.dp.mechanism == "discrete-gaussian" or self.sampling_rate >= 1:
            return None
        return self._compose([(z, self.sampling_rate) for z in self.multipliers])

    def _compose(self, rounds: Sequence[tuple[float, float]]) -> float:
        return Composition(rounds, delta=self.dp.delta, accountant=self.dp.accountant).epsilon()


__all__ = ["PrivacyLedger", "device_multipliers", "group_order", "privatize_in_groups", "privatize_rows", "round_entry"]
