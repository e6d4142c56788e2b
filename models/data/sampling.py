"""Training negatives and padded cohort tensors.

Training negatives are drawn every round, uniformly from all items minus the
device's *training* items (held-out items can be drawn: a real device does not
know its future). The draws are keyed (`models/keyed_random.py`): candidate
number `attempt` of negative slot j of the device's p-th positive is a hash of
(stream, user id, p * n_neg + j, attempt), so a device's negatives do not
depend on which other devices share its batch or on its row in it. Membership
is tested on sorted int64 keys `row * n_items + item` with `torch.searchsorted`
(or a boolean table for small cohorts); rejected draws are redrawn with the
next attempt number (only those), so the result is uniform over the allowed
items (up to the 32-bit bias of `KeyedStream.to_integers`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from models.base import CohortData
from models.data.types import ExplicitSplit, ImplicitSplit
from models.keyed_random import KeyedStream, mix32

_MAX_REDRAW_PASSES = 10_000
_BITMAP_MAX_CELLS = 1 << 26  # B * n_items up to this: boolean membership table


class NegativeSampler:
    """Keyed training negatives for one padded cohort, drawn any number of times
    (e.g. once per epoch, each with its own stream).

    Row b's negatives are uniform over the items not in items[b, :lengths[b]]
    (drawn independently, with replacement), keyed by the stream and the row's
    user id `users[b]` (see the module doc). The membership structure and the
    hashes of the slot numbers are built once, in the constructor.
    """

    def __init__(self, items: torch.Tensor, lengths: torch.Tensor, n_items: int, n_neg: int, users: torch.Tensor) -> None:
        if items.dim() != 2:
            raise ValueError(f"items must be (B, Lmax), got shape {tuple(items.shape)}")
        B, L = items.shape
        device = items.device
        if users.shape != (B,):
            raise ValueError(f"users must be ({B},), got shape {tuple(users.shape)}")
        self.shape = (B, L, n_neg)
        self.n_items, self.n_neg = n_items, n_neg
        self.device = device
        self.users = users.to(device=device, dtype=torch.int64)
        self.empty = B == 0 or L == 0 or n_neg == 0
        if self.empty:
            return
        lengths = lengths.to(device=device, dtype=torch.int64)
        self.valid = torch.arange(L, device=device)[None, :] < lengths[:, None]  # (B, L)
        pos_rows, pos_cols = torch.nonzero(self.valid, as_tuple=True)  # (P,) row and position of each positive
        pos_items = items[self.valid].to(torch.int64)
        if pos_items.numel() and (int(pos_items.min()) < 0 or int(pos_items.max()) >= n_items):
            raise ValueError(f"positive item ids must lie in [0, {n_items})")
        if B * n_items <= _BITMAP_MAX_CELLS:
            bitmap = torch.zeros((B, n_items), dtype=torch.bool, device=device)
            bitmap[pos_rows, pos_items] = True
            full = bitmap.all(dim=1) & (lengths > 0)
            self._bitmap: torch.Tensor | None = bitmap.view(-1)
            self._keys: torch.Tensor | None = None
        else:
            keys = torch.unique(pos_rows * n_items + pos_items)  # sorted
            distinct = torch.bincount(torch.div(keys, n_items, rounding_mode="floor"), minlength=B)
            full = distinct >= n_items
            self._bitmap, self._keys = None, keys
        if bool(full.any()):
            b = int(torch.nonzero(full)[0])
            raise ValueError(f"cohort row {b} has all {n_items} items as positives: no negative exists")
        self.rows = pos_rows.repeat_interleave(n_neg)  # (P * n_neg,)
        slot = (pos_cols * n_neg).repeat_interleave(n_neg) + torch.arange(n_neg, device=device).repeat(pos_cols.numel())
        self._slot_hash = mix32(slot)  # the per-element word of the keys, the same for every stream
        self._row_base = self.rows * n_items

    def _member(self, flat_rows: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        k = flat_rows + cand
        if self._bitmap is not None:
            return self._bitmap[k]
        keys = self._keys
        assert keys is not None
        idx = torch.searchsorted(keys, k).clamp_(max=keys.numel() - 1)
        return keys[idx] == k

    def draw_flat(self, stream: KeyedStream) -> torch.Tensor:
        """(P * n_neg,) negatives, positive-major (row, position, slot), in the
        order of `rows`."""
        if self.empty:
            return torch.zeros(0, dtype=torch.int64, device=self.device)
        ekeys = stream.user_keys(self.users)[self.rows]
        ekeys ^= self._slot_hash
        ekeys = mix32(ekeys)  # = stream.element_keys(user keys, slot)
        cand = KeyedStream.to_integers(KeyedStream.attempt(ekeys, 0), self.n_items)
        bad = torch.nonzero(self._member(self._row_base, cand)).squeeze(1)
        for attempt in range(1, _MAX_REDRAW_PASSES + 1):
            if bad.numel() == 0:
                break
            fresh = KeyedStream.to_integers(KeyedStream.attempt(ekeys[bad], attempt), self.n_items)
            cand[bad] = fresh
            bad = bad[self._member(self._row_base[bad], fresh)]
        else:  # pragma: no cover - needs an astronomically unlucky hash
            raise RuntimeError("negative sampling did not converge")
        return cand

    def draw(self, stream: KeyedStream) -> torch.Tensor:
        """(B, Lmax, n_neg) int64 negatives; padding positions get 0."""
        out = torch.zeros(self.shape, dtype=torch.int64, device=self.device)
        if not self.empty:
            out[self.valid] = self.draw_flat(stream).view(-1, self.n_neg)
        return out


def sample_negatives_padded(
    items: torch.Tensor,
    lengths: torch.Tensor,
    n_items: int,
    n_neg: int,
    stream: KeyedStream,
    users: torch.Tensor,
) -> torch.Tensor:
    """(B, Lmax, n_neg) int64 negatives for the padded positives `items` (B, Lmax)
    (`NegativeSampler` for one draw): row b's are uniform over the items not in
    items[b, :lengths[b]], keyed by `stream` and the row's user id `users[b]`.
    Padding positions get 0."""
    return NegativeSampler(items, lengths, n_items, n_neg, users).draw(stream)


def sample_negatives(data: CohortData, n_items: int, n_neg: int, stream: KeyedStream) -> torch.Tensor:
    """(B, Lmax, n_neg) negatives for a cohort whose `items` are its training
    items, keyed by `stream` and each row's user id (`data.users`)."""
    return sample_negatives_padded(data.items, data.lengths, n_items, n_neg, stream, data.users)


# ------------------------------------------------------------------ cohorts


#: Cells of the index table `pad_csr` builds at a time: its working memory
#: beyond the outputs is a few times this many int64s, whatever the table.
PAD_BLOCK_CELLS = 1 << 22


def pad_csr(
    indptr: np.ndarray,
    values: Sequence[np.ndarray],
    users: np.ndarray | torch.Tensor | Sequence[int],
    *,
    block_cells: int = PAD_BLOCK_CELLS,
) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """Pad the CSR rows of `users`: returns (lengths (B,), [padded (B, Lmax) per value
    array], mask (B, Lmax)). Padding is 0.

    The outputs are written a block of rows at a time (about `block_cells`
    cells a block), so the memory it takes beyond its outputs stays small
    even for a whole large population (at the ML-20M shape, one table of
    every user's rows is about a GiB, and building its index table in one
    piece took twice that again)."""
    u = np.asarray(users.cpu() if isinstance(users, torch.Tensor) else users, dtype=np.int64)
    starts = indptr[u]
    lengths = indptr[u + 1] - starts
    lmax = int(lengths.max()) if len(u) else 0
    ar = np.arange(lmax)
    mask = np.empty((len(u), lmax), dtype=bool)
    padded = [np.zeros((len(u), lmax), dtype=v.dtype) for v in values]
    rows = max(1, block_cells // max(lmax, 1))
    for lo in range(0, len(u), rows):
        hi = min(lo + rows, len(u))
        m = mask[lo:hi]
        np.less(ar[None, :], lengths[lo:hi, None], out=m)
        idx = np.where(m, starts[lo:hi, None] + ar[None, :], 0)
        for v, p in zip(values, padded, strict=True):
            if len(v):
                np.copyto(p[lo:hi], v[idx], where=m)
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
