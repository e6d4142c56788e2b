"""Training negatives and padded cohort tensors.

Training negatives are drawn every round, uniformly from all items minus the
device's *training* items (held-out items can be drawn: a real device does not
know its future). Membership is tested on sorted int64 keys
`row * n_items + item` with `torch.searchsorted`; rejected draws are redrawn
(only those), so the result is exactly uniform over the allowed items.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from models.base import CohortData
from models.data.types import ExplicitSplit, ImplicitSplit

_MAX_REDRAW_PASSES = 10_000
_BITMAP_MAX_CELLS = 1 << 26  # B * n_items up to this: boolean membership table


def sample_negatives_padded(
    items: torch.Tensor,
    lengths: torch.Tensor,
    n_items: int,
    n_neg: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """(B, Lmax, n_neg) int64 negatives for the padded positives `items` (B, Lmax).

    Row b's negatives are uniform over the items not in items[b, :lengths[b]]
    (drawn independently, with replacement). Padding positions get 0.
    """
    if items.dim() != 2:
        raise ValueError(f"items must be (B, Lmax), got shape {tuple(items.shape)}")
    B, L = items.shape
    device = items.device
    out = torch.zeros((B, L, n_neg), dtype=torch.int64, device=device)
    if B == 0 or L == 0 or n_neg == 0:
        return out
    lengths = lengths.to(device=device, dtype=torch.int64)
    valid = torch.arange(L, device=device)[None, :] < lengths[:, None]  # (B, L)
    pos_rows = torch.nonzero(valid)[:, 0]  # (P,) row of each real positive
    pos_items = items[valid].to(torch.int64)
    if pos_items.numel() and (int(pos_items.min()) < 0 or int(pos_items.max()) >= n_items):
        raise ValueError(f"positive item ids must lie in [0, {n_items})")

    if B * n_items <= _BITMAP_MAX_CELLS:
        bitmap = torch.zeros((B, n_items), dtype=torch.bool, device=device)
        bitmap[pos_rows, pos_items] = True
        full = bitmap.all(dim=1) & (lengths > 0)

        def member(r: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
            return bitmap[r, c]

    else:
        keys = torch.unique(pos_rows * n_items + pos_items)  # sorted

        def member(r: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
            k = r * n_items + c
            idx = torch.searchsorted(keys, k).clamp_(max=keys.numel() - 1)
            return keys[idx] == k

        distinct = torch.bincount(torch.div(keys, n_items, rounding_mode="floor"), minlength=B)
        full = distinct >= n_items
    if bool(full.any()):
        b = int(torch.nonzero(full)[0])
        raise ValueError(f"cohort row {b} has all {n_items} items as positives: no negative exists")

    rows = pos_rows.repeat_interleave(n_neg)
    cand = torch.randint(0, n_items, (rows.numel(),), generator=generator, device=device)
    bad = torch.nonzero(member(rows, cand)).squeeze(1)
    for _ in range(_MAX_REDRAW_PASSES):
        if bad.numel() == 0:
            break
        fresh = torch.randint(0, n_items, (bad.numel(),), generator=generator, device=device)
        cand[bad] = fresh
        bad = bad[member(rows[bad], fresh)]
    else:  # pragma: no cover - needs an astronomically unlucky generator
        raise RuntimeError("negative sampling did not converge")
    out[valid] = cand.view(-1, n_neg)
    return out


def sample_negatives(
    data: CohortData, n_items: int, n_neg: int, generator: torch.Generator
) -> torch.Tensor:
    """(B, Lmax, n_neg) negatives for a cohort whose `items` are its training items."""
    return sample_negatives_padded(data.items, data.lengths, n_items, n_neg, generator)


# ------------------------------------------------------------------ cohorts


def pad_csr(
    indptr: np.ndarray,
    values: Sequence[np.ndarray],
    users: np.ndarray | torch.Tensor | Sequence[int],
) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """Pad the CSR rows of `users`: returns (lengths (B,), [padded (B, Lmax) per value
    array], mask (B, Lmax)). Padding is 0."""
    u = np.asarray(users.cpu() if isinstance(users, torch.Tensor) else users, dtype=np.int64)
    starts = indptr[u]
    lengths = indptr[u + 1] - starts
    lmax = int(lengths.max()) if len(u) else 0
    ar = np.arange(lmax)
    mask = ar[None, :] < lengths[:, None]
    idx = np.where(mask, starts[:, None] + ar[None, :], 0)
    padded = []
    for v in values:
        if len(v) == 0:
            padded.append(np.zeros((len(u), lmax), dtype=v.dtype))
        else:
            p = v[idx]
            p[~mask] = 0
            padded.append(p)
    return lengths, padded, mask


def explicit_train_csr(split: ExplicitSplit) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indptr, items, ratings) of the training ratings, grouped by user."""
    order = np.argsort(split.train_user, kind="stable")
    counts = np.bincount(split.train_user, minlength=split.n_users)
    indptr = np.zeros(split.n_users + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return indptr, split.train_item[order], split.train_rating[order]


def cohort_data(
    split: ImplicitSplit | ExplicitSplit,
    users: np.ndarray | torch.Tensor | Sequence[int],
    *,
    device: torch.device | str | None = None,
    explicit_csr: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> CohortData:
    """The padded training data of `users` (implicit: items; explicit: items + ratings).

    For explicit splits pass `explicit_csr=explicit_train_csr(split)` when building
    many cohorts, to group the ratings only once.
    """
    if isinstance(split, ImplicitSplit):
        lengths, (items,), mask = pad_csr(split.train_indptr, [split.train_items], users)
        ratings = None
    elif isinstance(split, ExplicitSplit):
        indptr, it, rt = explicit_csr if explicit_csr is not None else explicit_train_csr(split)
        lengths, (items, rt_p), mask = pad_csr(indptr, [it, rt], users)
        ratings = torch.from_numpy(np.ascontiguousarray(rt_p, dtype=np.float32)).to(device)
    else:
        raise TypeError(f"expected ImplicitSplit or ExplicitSplit, got {type(split).__name__}")
    u = np.asarray(users.cpu() if isinstance(users, torch.Tensor) else users, dtype=np.int64)
    return CohortData(
        users=torch.from_numpy(u.copy()).to(device),
        items=torch.from_numpy(np.ascontiguousarray(items, dtype=np.int64)).to(device),
        mask=torch.from_numpy(mask).to(device),
        lengths=torch.from_numpy(lengths.astype(np.int64)).to(device),
        ratings=ratings,
    )
