"""Batched building blocks shared by the four recommenders.

Everything here works on a whole cohort at once: a padded `CohortData` is
flattened into one ragged list of (device, item[, rating]) samples, per-device
parameter tables are stored as one flat (B * m, k) table indexed by
`device * m + item`, and gradients are scattered with `index_add_`. There is no
Python loop over devices anywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from models.base import CohortData
from models.data.sampling import sample_negatives


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


def per_device_sum(values: torch.Tensor, dev: torch.Tensor, n_devices: int) -> torch.Tensor:
    """Sum of `values` (S, ...) grouped by `dev` (S,) -> (B, ...)."""
    out = values.new_zeros((n_devices, *values.shape[1:]))
    out.index_add_(0, dev, values)
    return out


def negative_samples(
    data: CohortData, n_items: int, n_neg: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """`n_neg` training negatives per positive as a flat (dev, item) list, from the
    data package's sampler: uniform over all items minus the device's *training*
    items (`data.items`), fresh on every call."""
    negs = sample_negatives(data, n_items, n_neg, generator)  # (B, Lmax, n_neg)
    mask = data.mask if data.mask.dtype == torch.bool else data.mask.bool()
    dev = mask.nonzero(as_tuple=True)[0].repeat_interleave(n_neg)
    return dev, negs[mask].reshape(-1)


def positive_table(flat: Flat, n_items: int) -> torch.Tensor:
    """(B, m) float32 0/1 table of each device's training positives."""
    out = torch.zeros(flat.n_devices * n_items, device=flat.item.device)
    out[flat.dev * n_items + flat.item] = 1.0
    return out.view(flat.n_devices, n_items)


def negative_counts(
    data: CohortData, n_items: int, n_neg: int, n_epochs: int, generator: torch.Generator
) -> torch.Tensor:
    """How often each item is drawn as a training negative of each device, per epoch.

    (n_epochs, B, m) uint8 (counts saturate at 255, far above anything drawn).
    Fresh draws every epoch: `n_neg` per positive, uniform over all items minus
    the device's training positives.
    """
    nb = int(data.items.shape[0])
    out = torch.zeros(n_epochs, nb * n_items, dtype=torch.uint8, device=data.items.device)
    for e in range(n_epochs):
        dev, item = negative_samples(data, n_items, n_neg, generator)
        c = torch.bincount(dev * n_items + item, minlength=nb * n_items)
        out[e] = c.clamp_(max=255).to(torch.uint8)
    return out.view(n_epochs, nb, n_items)


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


def minibatch_ids(
    dev: torch.Tensor, counts: torch.Tensor, batch_size: int, generator: torch.Generator
) -> tuple[torch.Tensor, int]:
    """Shuffle each device's samples into mini-batches of `batch_size`.

    `dev` must be sorted (device-major). Returns the batch index of every sample
    and the largest number of batches of any device (the loop length).
    """
    s = dev.shape[0]
    if s == 0:
        return torch.zeros(0, dtype=torch.int64, device=dev.device), 0
    # rank of each sample inside its device after a random shuffle:
    # sort by (device, random key) and take the position minus the device's start.
    key = torch.rand(s, generator=generator, device=generator.device).to(dev.device)
    order = torch.argsort(dev.to(torch.float64) * 2.0 + key.to(torch.float64))
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.empty_like(dev)
    rank[order] = torch.arange(s, device=dev.device) - starts[dev[order]]
    bid = rank // batch_size
    n_batches = int(math.ceil(int(counts.max()) / batch_size)) if counts.numel() else 0
    return bid, n_batches


def sigmoid_bce_grad(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """d BCE(sigmoid(z), y) / dz = sigmoid(z) - y."""
    return torch.sigmoid(logits) - labels


def bce_with_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="none")
