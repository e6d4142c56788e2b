"""The simulator's rounds under the distributed discrete Gaussian (D88).

The same mechanism the devices run (`dpmech`), step for step, with one
difference: the noise comes from the seeded fast sampler
(`dpmech.fast_sampler`, the same law drawn with numpy's generator) instead
of the operating system's CSPRNG, so a run is reproducible from its seed.
tests/models/test_sim_dp_mechanism.py compares the two paths' laws.

A round of B devices (`discrete_gaussian_round`):

1. the mechanism is calibrated once for the round (`dpmech.calibrate`): the
   field 2^32 sized for the B devices, one scale for every group (one
   encoding per round, D87), and each device's sigma^2 for its group: with
   distributed noise the shares of a group of |g| devices carry the noise
   multiplier z for that group's sum (`with_shares`), with local noise each
   device adds all of it;
2. every device's update is clipped in L2, rotated with the round's seed,
   scaled and rounded under the norm bound (`dpmech.mechanism.quantize`),
   in chunks of rows so that memory stays at a chunk's padded vectors;
3. its noise share is added and the vector reduced mod 2^w: with --secagg
   each device's residues go through the in-process SecAgg(+) round (in
   groups when the secure sum runs in groups), whose exact sum mod 2^w is
   checked; without it the group's rounded vectors are summed with their
   shares' noise drawn share by share (`dpmech.mechanism.simulated_sum`'s
   law; the noise of |g| shares is a sum of |g| draws, not a Gaussian), or,
   with --unmasked-sum (D95), as one draw per group of the law the shares'
   sum is within tau of (`dpmech.fast_sampler.group_noise`);
4. the server decodes the total once (`dpmech.mechanism.decode_sum`).

The round's privacy entry is priced as the coordinator prices it: each
group's zCDP rho for the devices it counted (all of them here: the
simulator has no dropouts), the round's the worst group's, and its
`noise_multiplier` the Gaussian's with the same Renyi curve,
1 / sqrt(2 rho), which `models.sim.dp_groups.PrivacyLedger` composes.

Cost: the fast sampler draws 65,536 coordinates in about 9 ms, so a cohort
of 943 devices adds about 8 s of noise a round at ML-100K's padded length
drawn share by share, and 9 ms with one draw per group. The rotation and
rounding cost about 1.2 ms a device at 131,072 padded coordinates and 5.4
ms at 524,288 (one core, compiled; `row_chunk` keeps a chunk near cache,
and the chunk's arrays are kept from chunk to chunk: D103).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from dpmech import fast_sampler
from dpmech import field as modular
from dpmech.calibrate import calibrate, noise_multiplier_of, with_shares
from dpmech.mechanism import MechanismConfig, decode_sum, privacy_rho
from dpmech.rotation import padded_dimension
from models.sim.fast_quantize import Workspace, quantize_rows, row_stats
from models.sim.row_order import next_slice

if TYPE_CHECKING:
    from models.sim.config import DPSettings
    from secagg.group_stream import GroupStream
    from secagg.grouped_round import GroupedOutcome

FIELD_BITS = 32  # the in-process secure sum's words
ROW_CHUNK = 64  # rows rotated and rounded at once, at most
CHUNK_COORDINATES = 1 << 22  # and at most this many padded coordinates (32 MB of float64: near cache)
_SEED_LABEL = b"fedmask/sim/dp-rotation/"

#: Draws one device's noise share: (generator, coordinates, sigma^2) -> int64 draws.
ShareSampler = Callable[[np.random.Generator, int, Fraction], np.ndarray]


class SecureSum(Protocol):
    """What a round needs of `models.sim.aggregation.SecureAggregator`: the
    round's secure sum of n devices, fed a piece at a time (its groups are
    the round's partition, `SecureAggregator.partition`)."""

    last: dict[str, Any]

    def stream(self, n: int, length: int, *, round_idx: int, clip: float) -> GroupStream: ...

    def finish(self, stream: GroupStream, round_idx: int) -> GroupedOutcome: ...


def rotation_seed(seed: int, round_idx: int) -> bytes:
    """The round's public rotation seed (the simulator has no session id)."""
    return _SEED_LABEL + f"{seed}/{round_idx}".encode()


def row_chunk(padded_dim: int) -> int:
    """Rows quantized at once: 64 up to d' = 65,536, fewer beyond, so that a
    chunk's arrays stay near cache (3 times faster per row at d' = 2^19).
    The rounding draws come from the round's generator chunk by chunk, so
    this number is part of what a seed reproduces."""
    return max(1, min(ROW_CHUNK, CHUNK_COORDINATES // padded_dim))


def stream_bytes(dim: int) -> int:
    """What a `DiscreteGaussianSum` of D = `dim` holds besides the updates fed
    to it: its buffer of rows (at most float64) and, without numba, a float64
    copy of them and their products (`fast_quantize.row_stats`; with it, a
    chunk sum of D floats instead), the clipped sum (float64), the total
    (int64 over the padded length), and a buffer's quantizing arrays
    (`fast_quantize.Workspace`: the rotated rows, their uniforms and rounded
    values, 8 bytes a padded coordinate each)."""
    padded = padded_dimension(dim)
    rows = row_chunk(padded)
    return 8 * (2 * rows * dim + dim + padded) + 3 * 8 * rows * padded


def round_mechanisms(dp: DPSettings, dim: int, groups: Sequence[Sequence[int]]) -> tuple[MechanismConfig, ...]:
    """The mechanism of each group's devices: one scale and field for the
    round, each group's shares calibrated to its size (distributed) or to
    one device (local); see the module doc."""
    devices = sum(len(g) for g in groups)
    distributed = dp.mode == "distributed"
    smallest = min(len(g) for g in groups)
    base = calibrate(dim=dim, clip=dp.clip, noise_multiplier=dp.noise, devices=devices,
                     shares=smallest if distributed else 1, bits=FIELD_BITS)
    return tuple(with_shares(base, dp.noise, len(g)) if distributed else base for g in groups)


def discrete_gaussian_round(
    updates: torch.Tensor,
    *,
    dp: DPSettings,
    groups: Sequence[Sequence[int]],
    seed: int,
    round_idx: int,
    secure: SecureSum | None,
    share_sampler: ShareSampler = fast_sampler.discrete_gaussian,
    one_draw_per_group: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any], dict[str, Any]]:
    """One round of the (B, D) updates under the discrete Gaussian: (the
    decoded sum of the clipped updates plus the counted shares' noise, the
    rows' pre-clipping norms, the round's privacy entry, what the secure sum
    did). `groups` lists the rows of each group and covers 0..B-1.
    `share_sampler` is a test seam, not a setting: no option, configuration
    or file reaches it, and production callers never pass it; the audit's
    tests (`models.sim.canary_audit`) pass a faulty sampler to check that
    `fedmask audit` catches noise the entry does not price.
    `one_draw_per_group` (--unmasked-sum, D95; needs `secure` None) draws
    each group's noise as one `fast_sampler.group_noise` instead of share by
    share: the same law to within the tau the entry prices, at one share's
    cost. The same as feeding the rows to a `DiscreteGaussianSum` in any
    pieces."""
    stream = DiscreteGaussianSum(int(updates.shape[0]), int(updates.shape[1]), dp=dp, groups=groups, seed=seed,
                                 round_idx=round_idx, secure=secure, share_sampler=share_sampler,
                                 one_draw_per_group=one_draw_per_group)
    stream.add(updates, np.arange(int(updates.shape[0])))
    total, norms, entry, secured = stream.finish()
    return (total.to(device=updates.device, dtype=updates.dtype), norms.to(device=updates.device, dtype=updates.dtype),
            entry, secured)


class DiscreteGaussianSum:
    """`discrete_gaussian_round` fed the cohort's updates a piece at a time
    (`add`, any sizes, in `order()`: the rows group by group, which is row
    order for one group), so that a round trained in chunks never holds the
    (B, D) table: rows wait in a buffer of `row_chunk` rows and are
    quantized a full buffer at a time, so the generator's draws, and the
    result, are the same bit for bit whatever the pieces. With `secure`
    each device's residues go to the round's secure sum as they are made
    (`GroupStream`, D100), which holds one group's residues at a time."""

    def __init__(self, devices: int, dim: int, *, dp: DPSettings, groups: Sequence[Sequence[int]], seed: int,
                 round_idx: int, secure: SecureSum | None, share_sampler: ShareSampler = fast_sampler.discrete_gaussian,
                 one_draw_per_group: bool = False) -> None:
        if one_draw_per_group and secure is not None:
            raise ValueError("one draw per group sums without masks: it cannot run with a secure sum")
        if sorted(r for g in groups for r in g) != list(range(devices)):
            raise ValueError(f"the groups must cover the {devices} rows exactly once")
        self.devices, self.dim, self.dp, self.groups, self.round_idx = devices, dim, dp, groups, round_idx
        self.secure, self.share_sampler, self.one_draw = secure, share_sampler, one_draw_per_group
        self.configs = round_mechanisms(dp, dim, groups)
        self.mech = self.configs[0]
        self.key = rotation_seed(seed, round_idx)
        self.rng = np.random.default_rng([seed, 88, round_idx])
        self.group_of = np.empty(devices, dtype=np.int64)
        for j, g in enumerate(groups):
            self.group_of[list(g)] = j
        self._order = np.fromiter((p for g in groups for p in g), dtype=np.int64, count=devices)
        self.secure_sum = (secure.stream(devices, self.mech.padded_dim, round_idx=round_idx, clip=1.0)
                           if secure is not None else None)  # fmt: skip
        if self.secure_sum is not None and self.secure_sum.groups != tuple(tuple(g) for g in groups):
            raise ValueError("the secure sum's groups are not the round's groups")
        self.total = np.zeros(self.mech.padded_dim, dtype=np.int64)
        self.norms = np.empty(devices, dtype=np.float64)
        self.clipped_sum = np.zeros(dim, dtype=np.float64)  # for the measured noise multiplier
        # the rows waiting to be quantized, as they came (float32, or float64 for anything else; made at the
        # first rows), the chunk's norms and its clipped sum's scratch (fast_quantize.row_stats)
        self.buffer: np.ndarray | None = None
        self.rows_at_once = row_chunk(self.mech.padded_dim)
        self.chunk_norms = np.empty(self.rows_at_once, dtype=np.float64)
        self.chunk_sum = np.empty(dim, dtype=np.float64)
        self.work = Workspace(self.rows_at_once, self.mech.padded_dim)  # the quantizing arrays, kept
        self.held = 0  # rows waiting in the buffer
        self.done = 0  # rows quantized
        self.device = torch.device("cpu")  # where the rows came from (the mean goes back there)

    def order(self) -> np.ndarray:
        """The order the rows come in: the groups' rows, group after group."""
        return self._order.copy()

    @property
    def counted(self) -> int:
        """The devices the sum counts: all (no dropouts in a simulated round)."""
        return self.devices

    def add(self, rows: torch.Tensor, positions: torch.Tensor | np.ndarray | None = None) -> None:
        """The next b rows (b, D) of the cohort in `order()`. With
        `positions` (the rows' cohort positions) the rows may come in any
        order within that next slice of `order()` (they are taken in its
        order); other positions are refused (ValueError)."""
        if rows.ndim != 2 or rows.shape[1] != self.dim:
            raise ValueError(f"expected rows of length {self.dim}, got shape {tuple(rows.shape)}")
        rows, _ = next_slice(self._order, self.done + self.held, rows, positions)
        self.device = rows.device
        source = rows.detach().to("cpu")
        if source.dtype != torch.float32:  # float32 rows are kept as they are: exact in float64
            source = source.to(torch.float64)
        if self.buffer is None:
            self.buffer = np.empty((self.rows_at_once, self.dim), dtype=source.numpy().dtype)
        elif self.buffer.dtype != source.numpy().dtype:
            raise ValueError(f"rows of {source.dtype} after rows of {self.buffer.dtype}: a round's rows are one kind")
        at = 0
        while at < source.shape[0]:
            take = min(source.shape[0] - at, len(self.buffer) - self.held)
            self.buffer[self.held:self.held + take] = source[at:at + take].numpy()
            self.held += take
            at += take
            if self.held == len(self.buffer):
                self._quantize()

    def _quantize(self) -> None:
        """The buffered rows: their norms, clipped sum, rounding, and shares (or their sum)."""
        assert self.buffer is not None
        x, start, mech = self.buffer[:self.held], self.done, self.mech
        pos = self._order[start:start + len(x)]
        norms = self.chunk_norms[:len(x)]  # np.linalg.norm's, and the clipped rows' sum, in one pass
        row_stats(x, self.dp.clip, norms, self.chunk_sum, self.clipped_sum)
        self.norms[pos] = norms
        rounded = quantize_rows(x, mech, self.key, self.rng, norms=norms, work=self.work)  # dpmech's, bit for bit
        self.done += self.held
        self.held = 0
        if self.one_draw:
            self.total = modular.wrap(self.total + rounded.sum(axis=0), mech.bits)
            return
        residues = np.empty(rounded.shape, dtype=np.uint32) if self.secure_sum is not None else None
        for k, (i, row) in enumerate(zip(pos, rounded, strict=True)):
            share = self.share_sampler(self.rng, mech.padded_dim, self.configs[self.group_of[i]].sigma2)
            noisy = modular.wrap(row + share, mech.bits)
            if residues is not None:
                residues[k] = modular.to_unsigned(noisy, mech.bits).astype(np.uint32)
            else:
                self.total = modular.wrap(self.total + noisy, mech.bits)
        if residues is not None and self.secure_sum is not None:
            self.secure_sum.add(pos, residues)

    def finish(self) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any], dict[str, Any]]:
        """Once every device's rows are in: `discrete_gaussian_round`'s result
        (the decoded sum and the norms in float64, on the CPU)."""
        if self.held:
            self._quantize()
        if self.done != self.devices:
            raise ValueError(f"the round has {self.devices} devices, {self.done} were added")
        mech, total = self.mech, self.total
        if self.one_draw:
            for g, cfg in zip(self.groups, self.configs, strict=True):
                noise = fast_sampler.group_noise(self.rng, len(g), mech.padded_dim, cfg.sigma2)
                total = modular.wrap(total + noise, mech.bits)
        secured: dict[str, Any] = {}
        if self.secure_sum is not None and self.secure is not None:
            out = self.secure.finish(self.secure_sum, self.round_idx)
            if out.encoded_sum is None or not out.exact:
                raise RuntimeError(f"the discrete Gaussian's residues were not summed exactly in round {self.round_idx}")
            secured = dict(self.secure.last)
            total = modular.from_unsigned(out.encoded_sum, mech.bits)
        decoded = decode_sum(total, mech, self.key)
        entry = privacy_entry(self.dp, self.groups, self.configs)
        entry["sum_noise_multiplier_measured"] = float(np.sqrt(np.mean((decoded - self.clipped_sum) ** 2))
                                                       / self.dp.clip)
        entry["scale"] = mech.scale
        entry["sensitivity_over_scaled_clip"] = mech.sensitivity / (mech.scale * mech.clip)
        return torch.as_tensor(decoded), torch.as_tensor(self.norms), entry, secured  # float64


def privacy_entry(dp: DPSettings, groups: Sequence[Sequence[int]],
                  configs: Sequence[MechanismConfig]) -> dict[str, Any]:
    """The round's entry: each group's rho and multiplier for the devices it
    counted (all; with local noise one device's share), the round's the
    worst group's (largest rho: smallest multiplier)."""
    rhos = [privacy_rho(cfg, len(g) if dp.mode == "distributed" else 1) for g, cfg in zip(groups, configs, strict=True)]
    lines = [{"size": len(g), "counted": len(g), "rho": rho, "noise_multiplier": noise_multiplier_of(rho),
              "sigma2": str(cfg.sigma2)} for g, cfg, rho in zip(groups, configs, rhos, strict=True)]
    worst = max(rhos)
    return {
        "mode": dp.mode,
        "mechanism": "discrete-gaussian",
        "groups": lines,
        "rho": worst,
        "noise_multiplier": noise_multiplier_of(worst),
        "sum_noise_multiplier_expected": dp.noise * math.sqrt(len(groups) if dp.mode == "distributed"
                                                              else sum(len(g) for g in groups)),
    }


__all__ = ["discrete_gaussian_round", "privacy_entry", "round_mechanisms", "rotation_seed"]
