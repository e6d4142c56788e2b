"""Sparse local training: what a device touched, and nothing else (docs/decisions.md D89).

A model's update and its private item tables are, for some models, non-zero
only on the item rows a device touched in a round (its positives and the
negatives it drew). Such a model also implements `SparseTraining`, and the
simulator then keeps, per device, only those rows (`models/sim/sparse_state.py`)
and sums the updates row by row. The dense `local_update` stays what an edge
client runs and sends; the sparse path must compute the same numbers.

Vocabulary:
- `ItemRows`: per-device item rows of width w, in CSR form: device b owns rows
  ptr[b]:ptr[b+1] of `items` (ascending within a device) and `values`. As an
  update it stands for the flat (B, n_items * w) table whose item-j slice
  [j*w, (j+1)*w) is the row of j, zero elsewhere.
- base: the global tensors a model's private rows are relative to
  (`SparseTraining.base_keys`): PFedRec's personal table is the global table E
  of the round the device last trained in plus its own rows. The simulator
  keeps each such global (by reference) while a device still refers to it.
- `SparseView`: what scoring a batch of devices needs: their dense private
  tensors, their rows and, per device, which base its rows are relative to.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from models.base import CohortData, GlobalState, LocalRound, PrivateState


@dataclass(frozen=True)
class ItemRows:
    """Per-device item rows (see the module doc). `ptr`: int64 (B + 1,), ptr[0] = 0;
    `items`: int64 (nnz,); `values`: (nnz, width)."""

    ptr: torch.Tensor
    items: torch.Tensor
    values: torch.Tensor

    @property
    def n_devices(self) -> int:
        return int(self.ptr.numel()) - 1

    @property
    def nnz(self) -> int:
        return int(self.items.numel())

    @property
    def width(self) -> int:
        return int(self.values.shape[1])

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.ptr, self.items, self.values))

    def devices(self) -> torch.Tensor:
        """int64 (nnz,): the device (0..B-1) of every row."""
        counts = self.ptr[1:] - self.ptr[:-1]
        return torch.repeat_interleave(torch.arange(self.n_devices, device=self.ptr.device), counts)

    def dense(self, n_items: int, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        """Devices lo..hi-1 as their dense (hi - lo, n_items * width) table."""
        hi = self.n_devices if hi is None else hi
        a, b = int(self.ptr[lo]), int(self.ptr[hi])
        w = self.width
        out = torch.zeros((hi - lo) * n_items, w, dtype=self.values.dtype, device=self.values.device)
        dev = self.devices()[a:b] - lo
        out.index_copy_(0, dev * n_items + self.items[a:b], self.values[a:b])
        return out.view(hi - lo, n_items * w)

    @staticmethod
    def from_keys(keys: torch.Tensor, values: torch.Tensor, n_devices: int, n_items: int) -> ItemRows:
        """Rows from sorted unique keys device * n_items + item."""
        dev = torch.div(keys, n_items, rounding_mode="floor")
        ptr = torch.zeros(n_devices + 1, dtype=torch.int64, device=keys.device)
        ptr[1:] = torch.cumsum(torch.bincount(dev, minlength=n_devices), 0)
        return ItemRows(ptr=ptr, items=keys - dev * n_items, values=values)

    @staticmethod
    def empty(n_devices: int, width: int, device: torch.device) -> ItemRows:
        return ItemRows(
            ptr=torch.zeros(n_devices + 1, dtype=torch.int64, device=device),
            items=torch.zeros(0, dtype=torch.int64, device=device),
            values=torch.zeros(0, width, device=device),
        )


@dataclass(frozen=True)
class SparseView:
    """A batch of B devices as stored sparsely: `dense` (B-row private tensors),
    `rows` (their private item rows, None for a model without any), and
    `bases[base_of[b]]`, the global tensors device b's rows are relative to."""

    dense: PrivateState
    rows: ItemRows | None
    bases: tuple[GlobalState, ...]
    base_of: torch.Tensor  # int64 (B,)


@dataclass(frozen=True)
class SparseResult:
    """What `local_update_sparse` returns for a cohort of B devices: the new dense
    private tensors, the new private rows (relative to the round's global
    `base_keys` tensors; None for a model without rows) and the updates as rows
    (the flat update of `local_update`, zero off these rows)."""

    dense: PrivateState
    rows: ItemRows | None
    update: ItemRows


class SparseTraining(ABC):
    """The sparse path of a model whose update and private item tables are zero
    off the rows a device touched (D89). Exactness contract: for every cohort,
    `local_update_sparse` gives the same dense private tensors, the same update
    (densified) and, with the rows added to the bases, the same private tables
    as `local_update`, up to float32 rounding of a different summation order;
    `score_sparse` gives the scores `score` gives on those tables."""

    #: the global tensors the private rows are relative to (none: the model has no private rows)
    base_keys: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def init_dense(self, data: CohortData, global_: GlobalState, seed: int) -> PrivateState:
        """The dense private tensors of `init_private` (without the item tables, which
        start as the initial global with no rows of their own)."""

    @abstractmethod
    def local_update_sparse(self, job: LocalRound) -> SparseResult:
        """`local_update` on the touched rows only; `job.private` holds the dense tensors."""

    @abstractmethod
    def score_sparse(
        self, global_: GlobalState, view: SparseView, users: torch.Tensor, items: torch.Tensor
    ) -> torch.Tensor:
        """`score` of the devices of `view` (B, K) for `items` (B, K)."""

    @abstractmethod
    def touched_rows(self, lengths: torch.Tensor) -> torch.Tensor:
        """float64 (B,): the expected number of item rows a device with `lengths`
        training positives touches in a round (what its update and private rows hold)."""

    @abstractmethod
    def sparse_train_bytes(self, lengths: torch.Tensor) -> int:
        """An upper estimate of the bytes `local_update_sparse` holds at once for a
        cohort whose devices have `lengths` training positives."""


def expected_distinct(draws: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """The expected number of distinct values among `draws` uniform draws with
    replacement from `pool` values (element-wise, float64)."""
    d, p = draws.to(torch.float64), pool.to(torch.float64).clamp(min=1.0)
    return p * -torch.expm1(d * torch.log1p(-1.0 / p).nan_to_num(neginf=-1e300))


def touched_with_negatives(lengths: torch.Tensor, n_items: int, draws_per_positive: int) -> torch.Tensor:
    """Expected rows touched by a device with `lengths` positives that draws
    `draws_per_positive` uniform negatives per positive from the other items."""
    L = lengths.to(torch.float64)
    return L + expected_distinct(L * draws_per_positive, n_items - L)


def dense_part(state: PrivateState, keys: tuple[str, ...]) -> PrivateState:
    """`state` without the item tables named by `keys`."""
    return {k: v for k, v in state.items() if k not in keys}
