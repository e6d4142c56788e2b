"""Batched building blocks shared by the four recommenders.

Everything here works on a whole cohort at once: a padded `CohortData` is
flattened into one ragged list of (device, item[, rating]) samples, per-device
parameter tables are stored as one flat (B * m, k) table indexed by
`device * m + item`, and gradients are scattered with `index_add_`. There is no
Python loop over devices anywhere.

Every random draw of local training is keyed by (seed, round, user id, ...)
(`models/keyed_random.py`), so a device's result does not depend on the other
devices of its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.base import CohortData
from models.data.sampling import NegativeSampler
from models.keyed_random import KeyedStream, Purpose, check_seed


@dataclass(frozen=True)
class Flat:
    """A cohort's training positives as one ragged list."""

    dev: torch.Tensor  # int64 (P,): position of the device in the cohort (0..B-1)
    item: torch.Tensor  # int64 (P,)
    rating: torch.Tensor | None  # float32 (P,) for explicit data
    counts: torch.Tensor  # int64 (B,): positives per device
    n_devices: int


def flatten(data: CohortData) -> Flat:
    """The valid (un-padded) entries of a padded cohort, device-major."""
    mask = data.mask
    if mask.dtype != torch.bool:
        mask = mask.bool()
    dev, col = mask.nonzero(as_tuple=True)
    item = data.items[dev, col]
    rating = None if data.ratings is None else data.ratings[dev, col].float()
    counts = mask.sum(1).to(torch.int64)
    return Flat(dev=dev, item=item, rating=rating, counts=counts, n_devices=int(mask.shape[0]))


def negatives_stream(seed: int, round_idx: int, epoch: int) -> KeyedStream:
    """The keyed stream of the training negatives of epoch `epoch` of round `round_idx`."""
    return KeyedStream.of(check_seed(seed), Purpose.NEGATIVES, round_idx, epoch)


def shuffle_stream(seed: int, round_idx: int, epoch: int) -> KeyedStream:
    """The keyed stream of the mini-batch order of epoch `epoch` of round `round_idx`."""
    return KeyedStream.of(check_seed(seed), Purpose.SHUFFLE, round_idx, epoch)


def negative_samples(
    data: CohortData, n_items: int, n_neg: int, stream: KeyedStream, sampler: NegativeSampler | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`n_neg` training negatives per positive as a flat (dev, item) list, from the
    data package's sampler: uniform over all items minus the device's *training*
    items (`data.items`), keyed by `stream` and the devices' user ids. Pass the
    cohort's `sampler` (`negative_sampler`) to draw several times cheaply."""
    if sampler is None:
        sampler = negative_sampler(data, n_items, n_neg)
    if sampler.empty:
        z = torch.zeros(0, dtype=torch.int64, device=data.items.device)
        return z, z.clone()
    return sampler.rows, sampler.draw_flat(stream)


def negative_sampler(data: CohortData, n_items: int, n_neg: int) -> NegativeSampler:
    """The keyed negative sampler of a cohort whose `items` are its training items."""
    return NegativeSampler(data.items, data.lengths, n_items, n_neg, data.users)


def positive_table(flat: Flat, n_items: int) -> torch.Tensor:
    """(B, m) float32 0/1 table of each device's training positives."""
    out = torch.zeros(flat.n_devices * n_items, device=flat.item.device)
    out[flat.dev * n_items + flat.item] = 1.0
    return out.view(flat.n_devices, n_items)


def negative_counts(
    data: CohortData, n_items: int, n_neg: int, n_epochs: int, *, seed: int, round_idx: int
) -> torch.Tensor:
    """How often each item is drawn as a training negative of each device, per epoch.

    (n_epochs, B, m) uint8 (counts saturate at 255, far above anything drawn).
    Fresh draws every epoch (`negatives_stream(seed, round_idx, epoch)`): `n_neg`
    per positive, uniform over all items minus the device's training positives.
    """
    nb = int(data.items.shape[0])
    out = torch.zeros(n_epochs, nb * n_items, dtype=torch.uint8, device=data.items.device)
    sampler = negative_sampler(data, n_items, n_neg)
    for e in range(n_epochs):
        dev, item = negative_samples(data, n_items, n_neg, negatives_stream(seed, round_idx, e), sampler)
        c = torch.bincount(dev * n_items + item, minlength=nb * n_items)
        out[e] = c.clamp_(max=255).to(torch.uint8)
    return out.view(n_epochs, nb, n_items)


def reuse_or_empty(spare: torch.Tensor | None, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """`spare` when it is a contiguous float32 table of `shape` on `device` (to be
    written over), else a new uninitialised one."""
    if (spare is not None and tuple(spare.shape) == shape and spare.dtype == torch.float32
            and spare.device == device and spare.is_contiguous()):
        return spare
    return torch.empty(shape, device=device)


def soft_threshold(x: torch.Tensor, thr: float) -> torch.Tensor:
    """Proximal operator of thr * ||x||_1 (element-wise shrinkage)."""
    if thr <= 0:
        return x
    return torch.sign(x) * torch.clamp(x.abs() - thr, min=0.0)


def randn(shape: tuple[int, ...], std: float, generator: torch.Generator) -> torch.Tensor:
    """float32 normal draws on the generator's device."""
    if std == 0.0:
        return torch.zeros(shape, device=generator.device)
    return torch.randn(shape, generator=generator, device=generator.device) * std


def within_device_index(dev: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Position of every sample inside its device's block, for a device-major
    (sorted) `dev` with `counts` samples per device."""
    starts = torch.cumsum(counts, 0) - counts
    return torch.arange(dev.shape[0], device=dev.device) - starts[dev]


def shuffle_ranks(
    dev: torch.Tensor, sample_index: torch.Tensor, counts: torch.Tensor, users: torch.Tensor, stream: KeyedStream
) -> torch.Tensor:
    """Rank of every sample inside its device after a keyed random shuffle.

    Sample i of device `dev[i]` gets the key uniform(stream, users[dev[i]],
    sample_index[i]) (`sample_index`: the sample's identity inside its device,
    e.g. its position in the device's own sample list), and samples are
    ordered by (device, key). So the order of a device's samples depends only
    on (stream, user, its samples), not on the other devices. `dev` need not
    be sorted; `counts` are the samples per device.
    """
    s = dev.shape[0]
    if s == 0:
        return torch.zeros(0, dtype=torch.int64, device=dev.device)
    ukeys = stream.user_keys(users.to(dev.device))
    key = KeyedStream.to_uniform(KeyedStream.attempt(stream.element_keys(ukeys[dev], sample_index), 0))
    # (device, key) as one float64, exact for batches below 2^19 devices (2 * dev + a 33-bit fraction);
    # equal keys (2^-32 chance per pair) fall back to the sample index (stable sort of a sorted index)
    order0 = torch.argsort(sample_index, stable=True)
    composite = dev.to(torch.float64) * 2.0 + key
    order = order0[torch.argsort(composite[order0], stable=True)]
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.empty_like(dev)
    rank[order] = torch.arange(s, device=dev.device) - starts[dev[order]]
    return rank
