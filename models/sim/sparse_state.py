"""The population's private state of a model trained sparsely (`models/sparse.py`, D89).

Per device: its dense private tensors (one row of each `dense` table, e.g.
PFedRec's score function w_i, b_i or FedMF's u_i, b_i), and, for a model with
private item rows, the rows of the round it last trained in and which global
tensors they are relative to (its *base*: the global of that round).

- Rows are kept in blocks: every `put` adds one block holding exactly the rows
  of the devices it wrote (the model's output tensors, adopted without a
  copy); a device's earlier rows become garbage. A block is freed when none of
  its rows is a device's current one, and `end_round` merges the live rows
  into one block when the garbage exceeds 1/16 of them. So between rounds the
  rows take between 1 and 17/16 times the live rows' bytes, and merging costs
  on average 16 copies of the rows a round writes (a cohort that covers the
  population frees its old blocks itself, without any merge).
- Bases are the engine's global tensors of a round, held by reference (the
  engine never changes a global tensor in place), counted by the devices
  whose rows refer to them, and dropped when the count reaches zero. Before
  its first round a device's table is the initial global, round 0's base.

`nbytes` is what all of this holds; the memory plan predicts it
(`models/sim/sparse_plan.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from models.base import GlobalState, PrivateState
from models.sparse import ItemRows, SparseResult, SparseTraining, SparseView

GARBAGE_FRACTION = 1.0 / 16.0  # merge the blocks when dead rows exceed this share of the live ones


@dataclass
class _Block:
    items: torch.Tensor  # int64 (rows,)
    values: torch.Tensor  # (rows, width)
    live: int  # rows that are some device's current rows


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class SparseTables:
    """See the module doc. `dense`: the population's dense private tensors (n rows each);
    `base`: the initial global tensors the rows are relative to (empty: no rows)."""

    def __init__(self, dense: PrivateState, n_rows: int, base: GlobalState, width: int) -> None:
        self.n_rows = n_rows
        self.dense = dense
        self.width = width
        self.has_rows = bool(base)
        self._base_keys = tuple(base)
        dev = next(iter(dense.values())).device if dense else torch.device("cpu")
        self._device = dev
        n_index = n_rows if self.has_rows else 0  # the per-device index exists for rows only

        def index() -> torch.Tensor:
            return torch.zeros(n_index, dtype=torch.int64, device=dev)

        self._block_of = index() - 1  # -1: no rows yet
        self._start, self._count, self._base_of = index(), index(), index()
        self._blocks: dict[int, _Block] = {}
        self._next_block = 0
        self._live = 0
        self._bases: dict[int, GlobalState] = {0: dict(base)} if self.has_rows else {}
        self._refs: dict[int, int] = {0: n_rows} if self.has_rows else {}

    # ------------------------------------------------------------ reading

    def take(self, rows: torch.Tensor | None) -> PrivateState:
        """The dense private tensors of `rows` (None: all, by reference)."""
        if rows is None:
            return self.dense
        return {k: v.index_select(0, rows.to(v.device)) for k, v in self.dense.items()}

    def view(self, rows: torch.Tensor) -> SparseView:
        """What scoring the devices `rows` needs (their dense tensors, rows and bases)."""
        dense = self.take(rows)
        if not self.has_rows:
            return SparseView(dense=dense, rows=None, bases=(), base_of=torch.zeros_like(rows))
        rows = rows.to(self._device)
        versions = self._base_of.index_select(0, rows)
        distinct = torch.unique(versions)
        bases = tuple(self._bases[int(v)] for v in distinct.tolist())
        return SparseView(
            dense=dense, rows=self._gather(rows), bases=bases, base_of=torch.searchsorted(distinct, versions)
        )

    def scorer(self, model: SparseTraining, global_: GlobalState) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
        """score(rows, users, items) of the current state, for `evaluate_state`."""

        def score(rows: torch.Tensor, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
            return model.score_sparse(global_, self.view(rows), users, items)

        return score

    def _gather(self, rows: torch.Tensor) -> ItemRows:
        """The current item rows of the devices `rows`, in that order."""
        count = self._count.index_select(0, rows)
        ptr = torch.zeros(rows.numel() + 1, dtype=torch.int64, device=self._device)
        torch.cumsum(count, 0, out=ptr[1:])
        nnz = int(ptr[-1])
        owner = torch.repeat_interleave(torch.arange(rows.numel(), device=self._device), count)
        src = self._start.index_select(0, rows)[owner] + torch.arange(nnz, device=self._device) - ptr[owner]
        block = self._block_of.index_select(0, rows)[owner]
        items = torch.empty(nnz, dtype=torch.int64, device=self._device)
        values = torch.empty(nnz, self.width, device=self._device)
        for b in torch.unique(block).tolist():
            sel = torch.nonzero(block == b).squeeze(1)
            blk = self._blocks[b]
            items[sel] = blk.items.index_select(0, src[sel])
            values[sel] = blk.values.index_select(0, src[sel])
        return ItemRows(ptr=ptr, items=items, values=values)

    # ------------------------------------------------------------ writing

    def put(self, rows: torch.Tensor | None, result: SparseResult, round_idx: int, global_: GlobalState) -> None:
        """Write the trained devices `rows` (None: all): their dense tensors, and their
        rows relative to the round's global `global_` (their new base)."""
        if rows is None:
            rows = torch.arange(self.n_rows, device=self._device)
        for k, v in result.dense.items():
            self.dense[k].index_copy_(0, rows.to(self.dense[k].device), v.to(self.dense[k].device))
        if not self.has_rows:
            return
        if result.rows is None or result.rows.n_devices != rows.numel():
            raise RuntimeError("sparse private state: the model returned no rows, or rows for other devices")
        rows = rows.to(self._device)
        self._drop_rows(rows)
        self._rebase(rows, round_idx, global_)
        new = result.rows
        b = self._next_block
        self._next_block += 1
        self._blocks[b] = _Block(items=new.items, values=new.values, live=new.nnz)
        self._live += new.nnz
        self._block_of[rows] = b
        self._start[rows] = new.ptr[:-1]
        self._count[rows] = new.ptr[1:] - new.ptr[:-1]

    def _drop_rows(self, rows: torch.Tensor) -> None:
        """The devices' current rows become garbage; blocks left without live rows are freed."""
        old = self._block_of.index_select(0, rows)
        cnt = self._count.index_select(0, rows)
        has = (old >= 0) & (cnt > 0)  # a device without rows may name a block already freed
        if not bool(has.any()):
            return
        blocks, inv = torch.unique(old[has], return_inverse=True)
        dead = torch.zeros(blocks.numel(), dtype=torch.int64, device=self._device).index_add_(0, inv, cnt[has])
        for b, d in zip(blocks.tolist(), dead.tolist(), strict=True):
            blk = self._blocks[b]
            blk.live -= d
            self._live -= d
            if blk.live == 0:
                del self._blocks[b]

    def _rebase(self, rows: torch.Tensor, round_idx: int, global_: GlobalState) -> None:
        """Move the devices' base references to round `round_idx`'s global."""
        versions, counts = torch.unique(self._base_of.index_select(0, rows), return_counts=True)
        for v, c in zip(versions.tolist(), counts.tolist(), strict=True):
            self._refs[v] -= c
            if self._refs[v] == 0:
                del self._refs[v], self._bases[v]
        if round_idx not in self._bases:
            self._bases[round_idx] = {k: global_[k] for k in self._base_keys}
        self._refs[round_idx] = self._refs.get(round_idx, 0) + int(rows.numel())
        self._base_of[rows] = round_idx

    def end_round(self) -> None:
        """Merge the blocks into one when their garbage exceeds GARBAGE_FRACTION of the live rows."""
        if not self.has_rows:
            return
        allocated = sum(int(b.items.numel()) for b in self._blocks.values())
        if allocated - self._live <= GARBAGE_FRACTION * self._live or len(self._blocks) <= 1:
            return
        everyone = torch.arange(self.n_rows, device=self._device)
        trained = everyone[self._block_of >= 0]
        merged = self._gather(trained)
        self._blocks = {self._next_block: _Block(items=merged.items, values=merged.values, live=merged.nnz)}
        self._block_of[trained] = self._next_block
        self._start[trained] = merged.ptr[:-1]
        self._next_block += 1

    # ------------------------------------------------------------ accounting

    def nbytes(self) -> int:
        """Bytes held: the dense tensors, the row blocks (live and garbage), the
        per-device index and the bases (each distinct tensor once)."""
        total = sum(_nbytes(v) for v in self.dense.values())
        total += sum(_nbytes(b.items) + _nbytes(b.values) for b in self._blocks.values())
        total += sum(_nbytes(t) for t in (self._block_of, self._start, self._count, self._base_of))
        seen: dict[int, int] = {}
        for base in self._bases.values():
            for t in base.values():
                seen[t.data_ptr()] = _nbytes(t)
        return total + sum(seen.values())

    def disk_bytes(self) -> int:
        """Nothing is kept on disk."""
        return 0

    def table(self) -> PrivateState:
        """The dense tensors of the whole population (for models' summaries)."""
        return self.dense

    def release(self) -> None:
        """Nothing is mapped (the engine's call after reading tables)."""

    def close(self) -> None:
        self.dense = {}
        self._blocks = {}
        self._bases = {}

    def live_rows(self) -> int:
        return self._live

    def base_count(self) -> int:
        return len(self._bases)
