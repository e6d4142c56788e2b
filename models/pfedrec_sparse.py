"""PFedRec's local round on the rows a device sampled (the sparse path, D89).

`PFedRec.local_update` keeps each chunk's W = E_i - E as a dense (chunk, m, k)
table and scores every item in every mini-batch step, but a step's gradient is
zero off the (device, item) pairs of its mini-batch: W moves on those rows only,
and the score function's gradient only reads them. So this path keeps W for the
rows the cohort sampled in the round (positives and drawn negatives, all epochs)
and runs every mini-batch step on its own pairs:

  1. w_i, b_i <- - lr * grad of the batch's mean BCE (item rows fixed);
  2. W rows   <- - lr_item * grad of the batch's summed BCE (with the new w_i, b_i).

Samples, negatives and mini-batch order are exactly the dense path's (the same
keyed draws); a pair drawn c times in one batch weighs c, as in its count
tables. The numbers differ from the dense path's only by float32 summation order
(a batch's score is <W_j + E_j, w> here, <W_j, w> + <E_j, w> there).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.base import LocalRound, PrivateState
from models.batched import (
    flatten,
    negative_sampler,
    negative_samples,
    negatives_stream,
    shuffle_ranks,
    shuffle_stream,
    within_device_index,
)
from models.sparse import ItemRows


@dataclass(frozen=True)
class Settings:
    """The hyperparameters of PFedRec's local round (see models/pfedrec.py) at one round."""

    n_items: int
    k: int
    local_epochs: int
    batch_size: int
    n_neg: int
    weight_decay: float
    lr: float  # the score function's step (already decayed for the round)
    lr_item: float  # the item rows' step


@dataclass
class _Batches:
    """One epoch's distinct (batch, device, item) pairs, sorted by batch, device and
    item: the touched row of each, its counts, and where each batch starts."""

    dev: torch.Tensor  # int64 (S,)
    item: torch.Tensor  # int64 (S,)
    row: torch.Tensor  # int64 (S,): index into the round's touched rows
    n_pos: torch.Tensor  # float32 (S,): times drawn as a positive (0 or 1)
    n_all: torch.Tensor  # float32 (S,): times drawn in all
    bounds: list[int]  # batch t is [bounds[t], bounds[t + 1])


def pfedrec_sparse_round(cfg: Settings, job: LocalRound) -> tuple[PrivateState, ItemRows]:
    """The cohort's new score functions {"w", "b"} and its rows W = E_i - E."""
    m = cfg.n_items
    flat = flatten(job.data)
    nb = flat.n_devices
    Eg = job.global_["E"]
    epochs = _epoch_samples(cfg, job)
    keys = [dev * m + item for dev, item, _, _ in epochs]
    touched = torch.unique(torch.cat(keys)) if keys else torch.zeros(0, dtype=torch.int64, device=Eg.device)
    W = torch.zeros(touched.numel(), cfg.k, device=Eg.device)
    w, bias = job.private["w"].clone(), job.private["b"].clone()
    for (_, _, y, bid), key in zip(epochs, keys, strict=True):
        batches = _group(key, y, bid, touched, nb, m)
        for t in range(len(batches.bounds) - 1):
            _step(cfg, batches, t, Eg, W, w, bias)
    return {"w": w, "b": bias}, ItemRows.from_keys(touched, W, nb, m)


def _epoch_samples(cfg: Settings, job: LocalRound) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per epoch (device, item, label, mini-batch id) of every sample, as the dense path draws them."""
    m, bs, n_neg = cfg.n_items, cfg.batch_size, cfg.n_neg
    flat = flatten(job.data)
    dev_t = flat.item.device
    n_samples = flat.counts * (1 + n_neg)
    pos_idx = within_device_index(flat.dev, flat.counts)
    neg_idx = (flat.counts[flat.dev] + pos_idx * n_neg).repeat_interleave(n_neg) + torch.arange(
        n_neg, device=dev_t
    ).repeat(pos_idx.numel())
    sample_idx = torch.cat([pos_idx, neg_idx])
    sampler = negative_sampler(job.data, m, n_neg)
    out = []
    for e in range(cfg.local_epochs):
        ndev, nitem = negative_samples(job.data, m, n_neg, negatives_stream(job.seed, job.round_idx, e), sampler)
        dev = torch.cat([flat.dev, ndev])
        item = torch.cat([flat.item, nitem])
        y = torch.cat([torch.ones_like(flat.item), torch.zeros_like(nitem)]).to(torch.float32)
        rank = shuffle_ranks(dev, sample_idx, n_samples, job.data.users, shuffle_stream(job.seed, job.round_idx, e))
        out.append((dev, item, y, rank // bs))
    return out


def _group(
    key: torch.Tensor, y: torch.Tensor, bid: torch.Tensor, touched: torch.Tensor, nb: int, m: int
) -> _Batches:
    """The distinct (batch, key) pairs of one epoch with their counts."""
    span = nb * m
    pair, inv, count = torch.unique(bid * span + key, return_inverse=True, return_counts=True)
    n_pos = torch.zeros(pair.numel(), device=key.device).index_add_(0, inv, y)
    batch = torch.div(pair, span, rounding_mode="floor")
    k = pair - batch * span
    dev = torch.div(k, m, rounding_mode="floor")
    t_max = int(batch[-1]) + 1 if batch.numel() else 0
    bounds = torch.searchsorted(batch, torch.arange(t_max + 1, device=key.device)).tolist()
    return _Batches(dev=dev, item=k - dev * m, row=torch.searchsorted(touched, k), n_pos=n_pos,
                    n_all=count.to(torch.float32), bounds=bounds)  # fmt: skip


def _step(
    cfg: Settings, b: _Batches, t: int, Eg: torch.Tensor, W: torch.Tensor, w: torch.Tensor, bias: torch.Tensor
) -> None:
    """Mini-batch t of every device that has one: the score function's step, then the
    item rows' step (w, bias and W in place)."""
    lo, hi = b.bounds[t], b.bounds[t + 1]
    if hi == lo:
        return
    act, loc = torch.unique_consecutive(b.dev[lo:hi], return_inverse=True)  # the batch's devices
    rows = b.row[lo:hi]
    c_pos, c_all = b.n_pos[lo:hi], b.n_all[lo:hi]
    c_neg = c_all - c_pos
    n_act = act.numel()
    per_dev = torch.zeros(n_act, device=W.device).index_add_(0, loc, c_all)  # samples per device (>= 1)
    emb = W.index_select(0, rows) + Eg.index_select(0, b.item[lo:hi])  # (S, k): the rows of E_i
    w_a, b_a = w.index_select(0, act), bias.index_select(0, act)
    # 1. score function, item rows fixed (mean BCE of the batch)
    p = torch.sigmoid((emb * w_a.index_select(0, loc)).sum(1) + b_a.index_select(0, loc))
    g = c_neg * p + c_pos * (p - 1.0)
    gw = torch.zeros(n_act, cfg.k, device=W.device).index_add_(0, loc, emb * g.unsqueeze(1)) / per_dev.unsqueeze(1)
    if cfg.weight_decay > 0:
        gw = gw + cfg.weight_decay * w_a
    w_a = w_a - cfg.lr * gw
    b_a = b_a - cfg.lr * torch.zeros(n_act, device=W.device).index_add_(0, loc, g) / per_dev
    # 2. item rows with the updated score function (summed BCE)
    w_s = w_a.index_select(0, loc)
    p = torch.sigmoid((emb * w_s).sum(1) + b_a.index_select(0, loc))
    g = c_neg * p + c_pos * (p - 1.0)
    W.index_add_(0, rows, w_s.mul_(g.unsqueeze(1)), alpha=-cfg.lr_item)
    w.index_copy_(0, act, w_a)
    bias.index_copy_(0, act, b_a)
