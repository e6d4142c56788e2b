"""Removable noise (Dordis's way) around the discrete Gaussian mechanism:
what a device adds and what the server takes back, as pure functions.

A round's `MechanismConfig` names each device's D19 share sigma^2: a group
of n devices then targets sigma_T^2 = n sigma^2 in its sum. Under removable
noise (`RemovableNoise.for_group`) a device of that group with threshold t
adds the components v_0 = sigma^2, v_1, ..., v_{n-t} of
`dpmech.removable_noise` (sigma_T^2 / t in all): component 0 from the
operating system's CSPRNG, component k >= 1 from its own fresh 32-byte seed,
which the secure sum secret-shares (`secagg`, `removable_seeds`). When s of
the n are counted, the server rebuilds the seeds of each counted device's
components k > n - s and subtracts them (`remove_surplus`): the sum keeps
s (v_0 + ... + v_{n-s}) >= sigma_T^2, the target, whatever the dropouts
up to n - t.

Everything here is exact integer arithmetic mod 2^w: the device's residues
(`encode`) and the removal commute with the secure sum's reduction, so the
unmasked sum minus the surplus equals the counted devices' rounded updates
plus their kept noise, bit for bit, mod 2^w.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from dpmech import field as modular
from dpmech.exact_sampler import discrete_gaussian
from dpmech.mechanism import MechanismConfig, quantize
from dpmech.random_source import I64, ByteSource, SystemBytes
from dpmech.removable_noise import SEED_BYTES, component_noise, component_variances, removed_components


@dataclass(frozen=True)
class RemovableNoise:
    """One group's decomposition: n devices, threshold t, and the variances
    (v_0, ..., v_{n-t}) each device draws (v_0 = the mechanism's sigma^2)."""

    devices: int
    threshold: int
    variances: tuple[Fraction, ...]

    @classmethod
    def for_group(cls, mechanism: MechanismConfig, devices: int, threshold: int) -> RemovableNoise:
        """The group's components for a target of n times the mechanism's
        sigma^2 (D19's sum without dropouts). ValueError for t outside 1..n."""
        variances = component_variances(devices, threshold, devices * mechanism.sigma2)
        if variances[0] != mechanism.sigma2:  # target / n is sigma^2 itself, which the mechanism already draws
            raise AssertionError("component 0 must be the mechanism's own share")
        return cls(devices=devices, threshold=threshold, variances=variances)

    @property
    def components(self) -> int:
        """m = n - t seeded components per device."""
        return len(self.variances) - 1

    def removed(self, counted: int) -> range:
        """The components k taken out of each counted device when `counted`
        are in the sum: n - counted + 1 .. m. ValueError below t."""
        if not self.threshold <= counted <= self.devices:
            raise ValueError(f"{counted} counted devices: a sum of this group counts {self.threshold} to "
                             f"{self.devices}")
        return removed_components(self.devices, self.threshold, counted)


def new_seeds(removable: RemovableNoise, rand: Callable[[int], bytes] = os.urandom) -> tuple[bytes, ...]:
    """A device's fresh component seeds 1..m (from the OS CSPRNG by default)."""
    return tuple(rand(SEED_BYTES) for _ in range(removable.components))


def encode(update: npt.NDArray[np.float64], mechanism: MechanismConfig, rotation_seed: bytes,
           rng: np.random.Generator, removable: RemovableNoise, seeds: Sequence[bytes],
           noise: ByteSource | None = None) -> I64:
    """`dpmech.mechanism.encode` with every component added: the rounded
    update + N_Z(0, v_0) from `noise` (default: the OS CSPRNG) + component k
    from `seeds[k - 1]`, centred mod 2^w."""
    if update.ndim != 1:
        raise ValueError(f"encode takes one update (dim,), got shape {update.shape}")
    if len(seeds) != removable.components:
        raise ValueError(f"need {removable.components} component seeds, got {len(seeds)}")
    total = quantize(update, mechanism, rotation_seed, rng)
    total = total + discrete_gaussian(mechanism.padded_dim, removable.variances[0], noise or SystemBytes())
    for k, seed in enumerate(seeds, start=1):
        total += component_noise(seed, removable.variances[k], mechanism.padded_dim)
    return modular.wrap(total, mechanism.bits)


def surplus(removed_seeds: Mapping[int, Mapping[int, bytes]], removable: RemovableNoise,
            mechanism: MechanismConfig) -> I64:
    """The sum of every listed component (owner -> k -> seed), int64,
    not reduced: what the server subtracts."""
    total = np.zeros(mechanism.padded_dim, dtype=np.int64)
    for owner in sorted(removed_seeds):
        for k, seed in sorted(removed_seeds[owner].items()):
            if not 1 <= k <= removable.components:
                raise ValueError(f"component {k} of device {owner} is outside 1..{removable.components}")
            total += component_noise(seed, removable.variances[k], mechanism.padded_dim)
    return total


def remove_surplus(residues: np.ndarray, counted: int,
                   removed_seeds: Mapping[int, Mapping[int, bytes]], removable: RemovableNoise,
                   mechanism: MechanismConfig) -> npt.NDArray[np.uint32]:
    """The sum's residues (mod 2^w, the padded update's d' coordinates)
    without the surplus: `removed_seeds` must hold exactly the components
    `removable.removed(counted)` of `counted` devices (ValueError else, so
    that a partial removal is never released as the target's noise)."""
    want = removable.removed(counted)
    if len(removed_seeds) != (counted if len(want) else 0) or any(
            sorted(ks) != list(want) for ks in removed_seeds.values()):
        raise ValueError(f"removal needs components {list(want)} of each of the {counted} counted devices")
    if residues.shape != (mechanism.padded_dim,):
        raise ValueError(f"the sum must have {mechanism.padded_dim} coordinates, got shape {residues.shape}")
    centred = modular.from_unsigned(residues.astype(np.uint64), mechanism.bits)
    kept = modular.wrap(centred - surplus(removed_seeds, removable, mechanism), mechanism.bits)
    return modular.to_unsigned(kept, mechanism.bits).astype(np.uint32)
