"""The population's private state in the simulator, in RAM or in memory-mapped files.

Row i of every table belongs to population device i. The engine keeps one
buffer, the current state, and every round writes it in place (the best
validation round is tested when reached, D101). A second buffer exists only
when `keep_best` marks the current state as kept (a checkpoint of an earlier
version that kept it): a round then writes into the other buffer (copying the
rows the cohort does not cover first), so the kept state never changes (copy
on write, without copying anything when the whole population trains).

In RAM the buffers are torch tensors; `take(None)` returns the buffer itself
and `put(None, part)` adopts `part` as the new buffer, so an unchunked round
holds exactly what the engine held before chunking existed.

On disk each table is a file of raw rows mapped with `mmap`; `take` copies the
rows into RAM tensors and `put` writes them back. After every access the
mapping's pages are released from this process (`madvise(MADV_DONTNEED)`;
the kernel keeps written pages in its page cache and writes them back), so the
resident memory of the process stays at the chunk's rows, however large the
files are. The directory and its files are removed by `close`.

On disk a row of a table that has never been written holds zeros (the file is
sparse), so `put` does not write a row that is all zero where that table's row
was never written, and `take` fills such rows with zeros without reading the
file. A table that starts at zero for every device (FedRAP's D_i,
`FederatedRecommender.zero_at_init`) thus takes disk only for the devices
that have trained, and a device never trained costs no read: at ML-20M's
size with 2,000 devices a round that is 10,000 rows in 5 rounds, not 138,493.

Contract: rows passed to `take`/`put` are int64 tensors of distinct row numbers;
`part` has the tables' names, trailing shapes and dtypes.
"""

from __future__ import annotations

import mmap
import shutil
import tempfile
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from models.base import PrivateState

Which = Literal["current", "best"]

IO_STEP_BYTES = 128 * 1024**2  # mapped pages a disk access holds before releasing them


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _not_all_zero_bits(rows: torch.Tensor) -> torch.Tensor:
    """Per row, whether any element has a bit set (-0.0 counts: it is not what a hole reads as)."""
    flat = rows.reshape(int(rows.shape[0]), -1)
    if flat.dtype == torch.bool:
        return flat.any(dim=1)
    return flat.view(_SAME_SIZE_INT[flat.element_size()]).ne(0).any(dim=1)


class _DiskBuffer:
    """One buffer of mapped files (one per table)."""

    def __init__(self, folder: Path, like: PrivateState, n_rows: int) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.maps: list[mmap.mmap] = []
        self.tables: PrivateState = {}
        # per table, the rows ever written (the others read as zeros: the file is sparse)
        self.written: dict[str, torch.Tensor] = {name: torch.zeros(n_rows, dtype=torch.bool) for name in like}
        for name, row in like.items():
            arr = row.detach().cpu().numpy()
            nbytes = max(1, n_rows * arr.nbytes)
            path = folder / f"{name}.bin"
            with open(path, "w+b") as f:
                f.truncate(nbytes)  # sparse: disk is used as rows are written
                mm = mmap.mmap(f.fileno(), nbytes)
            self.maps.append(mm)
            flat = np.frombuffer(mm, dtype=arr.dtype, count=n_rows * arr.size)
            self.tables[name] = torch.from_numpy(flat.reshape((n_rows, *arr.shape)))

    def release(self) -> None:
        """Drop the mapped pages from this process (dirty ones stay in the page cache)."""
        for mm in self.maps:
            mm.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        self.tables = {}
        for mm in self.maps:
            mm.close()
        self.maps = []


class PrivateTables:
    """See the module doc. Build with `in_memory(state)` or `on_disk(row, n, folder)`."""

    def __init__(self, n_rows: int, like: PrivateState, folder: Path | None) -> None:
        self.n_rows = n_rows
        self._like = {k: v[0].detach().clone() for k, v in like.items()} if folder is not None else {}
        self._folder = folder
        self._owns_folder = False
        self._bufs: list[PrivateState | None] = [None, None]
        self._disk: list[_DiskBuffer | None] = [None, None]
        self.current = 0
        self.best: int | None = None
        self._write = 0

    # ------------------------------------------------------------ construction

    @classmethod
    def in_memory(cls, state: PrivateState, n_rows: int) -> PrivateTables:
        """Tables holding `state` (every tensor: n_rows rows) by reference."""
        t = cls(n_rows, state, None)
        t._bufs[0] = state
        return t

    @classmethod
    def empty_in_memory(cls, row: PrivateState, n_rows: int) -> PrivateTables:
        """Uninitialised RAM tables shaped like the one-device state `row` (fill with `put`)."""
        state = {k: torch.empty((n_rows, *v.shape[1:]), dtype=v.dtype, device=v.device) for k, v in row.items()}
        return cls.in_memory(state, n_rows)

    @classmethod
    def on_disk(cls, row: PrivateState, n_rows: int, folder: str | Path | None) -> PrivateTables:
        """Memory-mapped tables shaped like the one-device state `row`, in a new
        folder under `folder` (None: the system's temporary directory)."""
        if folder is not None:
            Path(folder).mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix="fedmask-private-", dir=folder))
        t = cls(n_rows, row, root)
        t._owns_folder = True
        disk = _DiskBuffer(root / "buffer0", t._like, n_rows)
        t._disk[0] = disk
        t._bufs[0] = disk.tables
        return t

    @property
    def on_disk_folder(self) -> Path | None:
        return self._folder

    def nbytes(self) -> int:
        """Bytes the private state holds now: its buffers in RAM plus its files on disk."""
        if self._folder is not None:
            return self.disk_bytes()
        return sum(v.numel() * v.element_size() for buf in self._bufs if buf is not None for v in buf.values())

    def disk_bytes(self) -> int:
        """Bytes the mapped files occupy on disk now (allocated blocks)."""
        if self._folder is None:
            return 0
        return sum(p.stat().st_blocks * 512 for p in self._folder.rglob("*.bin"))

    # ------------------------------------------------------------ access

    def _buffer(self, idx: int) -> PrivateState:
        buf = self._bufs[idx]
        if buf is None:
            raise RuntimeError("private tables: buffer not allocated")
        return buf

    def _index(self, which: Which) -> int:
        """The buffer holding the current or kept best state."""
        return self.current if which == "current" or self.best is None else self.best

    def _release(self, idx: int) -> None:
        d = self._disk[idx]
        if d is not None:
            d.release()

    def take(self, rows: torch.Tensor | None, which: Which = "current", *, read_only: bool = False) -> PrivateState:
        """Rows `rows` (None: all, by reference in RAM) of the current or kept
        best state. `read_only` (a caller that never writes them, e.g. an
        evaluation): consecutive rows in RAM come as a view, not a copy."""
        idx = self._index(which)
        buf = self._buffer(idx)
        if rows is None:
            if self._folder is None:
                return buf
            rows = torch.arange(self.n_rows)
        if self._folder is None:
            n = int(rows.numel())
            if read_only and n and int(rows[-1]) - int(rows[0]) == n - 1 and bool((rows.diff() == 1).all()):
                lo = int(rows[0])
                return {k: v[lo : lo + n] for k, v in buf.items()}
            return {k: v.index_select(0, rows.to(v.device)) for k, v in buf.items()}
        out = {k: torch.empty((int(rows.numel()), *v.shape[1:]), dtype=v.dtype) for k, v in buf.items()}
        written = self._written(idx)
        for s in range(0, int(rows.numel()), self._step(buf)):  # mapped pages released every step
            part = rows[s : s + self._step(buf)].cpu()
            for k, v in buf.items():
                dst = out[k][s : s + part.numel()]
                seen = written[k][part]
                if bool(seen.all()):
                    torch.index_select(v, 0, part, out=dst)
                else:  # rows never written are zeros: not read
                    dst.zero_()
                    if bool(seen.any()):
                        dst[seen] = v.index_select(0, part[seen])
            self._release(idx)
        return out

    def take_items(self, rows: torch.Tensor, items: torch.Tensor, tables: tuple[str, ...],
                   which: Which = "current") -> PrivateState:
        """Rows `rows` (B,) of the current or kept best state, the tables named
        in `tables` (an item axis second) taken only at `items` (B, K): (B, K,
        ...) each, the others whole rows. What a scorer reads, without copying
        m rows a device (models.base.FederatedRecommender.gathered_tables)."""
        idx = self._index(which)
        buf = self._buffer(idx)
        written = self._written(idx) if self._folder is not None else None
        on_cpu = rows.cpu()
        out: PrivateState = {}
        for k, v in buf.items():
            r, it = rows.to(v.device), items.to(v.device)  # no copy where they are already there
            seen = None if written is None else written[k][on_cpu]
            if seen is None or bool(seen.all()):
                out[k] = v[r.unsqueeze(1), it] if k in tables else v.index_select(0, r)
                continue
            shape = (*it.shape, *v.shape[2:]) if k in tables else (int(r.numel()), *v.shape[1:])
            out[k] = torch.zeros(shape, dtype=v.dtype)  # rows never written are zeros: not read
            if bool(seen.any()):
                out[k][seen] = v[r[seen].unsqueeze(1), it[seen]] if k in tables else v.index_select(0, r[seen])
        self._release(idx)
        return out

    def _written(self, idx: int) -> dict[str, torch.Tensor]:
        """Per table of a disk buffer, the rows ever written."""
        d = self._disk[idx]
        if d is None:
            raise RuntimeError("private tables: no disk buffer")
        return d.written

    def _step(self, buf: PrivateState) -> int:
        """Rows per step of a disk access: about IO_STEP_BYTES of mapped pages."""
        row = sum(v[0].numel() * v.element_size() for v in buf.values()) if self.n_rows else 1
        return max(1, IO_STEP_BYTES // max(1, row))

    def table(self, which: Which = "current") -> PrivateState:
        """The whole tables by reference (for models' summaries). On disk, call
        `release()` after reading them."""
        return self._buffer(self._index(which))

    def release(self) -> None:
        for i in (0, 1):
            self._release(i)

    # ------------------------------------------------------------ rounds

    def begin_round(self, covers_all: bool) -> None:
        """Choose the buffer this round writes: the current one unless it is the
        kept best. `covers_all`: the round writes every row (else the other rows
        are copied over first)."""
        if self.best != self.current:
            self._write = self.current
            return
        other = 1 - self.current
        if self._bufs[other] is None and self._folder is not None:
            disk = _DiskBuffer(self._folder / f"buffer{other}", self._like, self.n_rows)
            self._disk[other] = disk
            self._bufs[other] = disk.tables
        self._write = other
        if covers_all:
            return
        src = self._buffer(self.current)
        if self._bufs[other] is None:  # RAM, first time
            self._bufs[other] = {k: v.clone() for k, v in src.items()}
            return
        dst = self._buffer(other)
        step = self._step(src)
        seen, into = self._written(self.current), self._written(other)
        for s in range(0, self.n_rows, step):
            block = torch.arange(s, min(s + step, self.n_rows))
            for k, v in src.items():
                part = block[seen[k][block] | into[k][block]]  # the rest are zeros on both sides
                dst[k].index_copy_(0, part, v.index_select(0, part))
            self.release()
        for k in into:
            into[k] |= seen[k]

    def put(self, rows: torch.Tensor | None, part: PrivateState) -> None:
        """Write the trained rows (None: all rows; in RAM `part` is adopted as the buffer)."""
        if rows is None and self._folder is None:
            self._bufs[self._write] = part
            return
        if self._bufs[self._write] is None:  # RAM, chunked, first write into the other buffer
            self._bufs[self._write] = {
                k: torch.empty((self.n_rows, *v.shape[1:]), dtype=v.dtype, device=v.device) for k, v in part.items()
            }
        dst = self._buffer(self._write)
        if rows is None:
            rows = torch.arange(self.n_rows)
        if self._folder is None:
            for k, v in part.items():
                dst[k].index_copy_(0, rows.to(dst[k].device), v.to(dst[k].device))
            return
        step = self._step(dst)
        written = self._written(self._write)
        for s in range(0, int(rows.numel()), step):  # mapped pages released every step
            r = rows[s : s + step].cpu()
            for k, v in part.items():
                rows_k = v[s : s + step].cpu()
                # an all-zero row where nothing was written reads as zeros already: not written
                keep = written[k][r] | _not_all_zero_bits(rows_k)
                if bool(keep.all()):
                    dst[k].index_copy_(0, r, rows_k)
                elif bool(keep.any()):
                    dst[k].index_copy_(0, r[keep], rows_k[keep])
                written[k][r[keep]] = True
            self._release(self._write)

    def spare(self) -> PrivateState | None:
        """Tables a whole-population round, which ends with `put(None, ...)`, may
        write its new state into instead of fresh pages (D97): the buffer that `put`
        replaces, which nothing keeps (never the kept best). It is the current state
        itself, the round's input, unless that is the kept best (then a stale one).
        None on disk, or before the buffer exists."""
        if self._folder is not None or self._write == self.best:
            return None
        return self._bufs[self._write]

    def end_round(self) -> None:
        self.current = self._write

    def keep_best(self) -> None:
        """Mark the current state as the kept best (it is never written again)."""
        self.best = self.current

    def close(self) -> None:
        """Unmap and delete the files (disk); drop the buffers."""
        self._bufs = [None, None]
        for d in self._disk:
            if d is not None:
                d.close()
        self._disk = [None, None]
        if self._owns_folder and self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
