"""The simulator's steps 1-4 of the DP mechanism in compiled loops (numba),
equal bit for bit to `dpmech.mechanism.quantize`.

Where numba is installed (`pip install 'fedmask[fast]'`, pinned in
constraints.txt; the dev extra has it), `quantize_rows` clips, pads, flips
signs, transforms, scales and rounds a chunk of rows in two compiled passes
instead of numpy's twenty-odd; elsewhere it is `dpmech.mechanism.quantize`
itself. Either way the result is the same array, bit for bit
(tests/models/test_fast_quantize.py), because every float operation is
the one numpy does, in the same order:

- the clip factor is numpy's (`dpmech.quantize.clip_l2`'s norm), applied
  as (x * factor) * sign;
- the transform is the Sylvester butterflies in stage order h = 1, 2, ...
  (each coordinate's sums are the same whatever the loop order within a
  stage), two or three stages a pass (radix 4 and 8: the same sums and
  differences of the same numbers, with fewer passes over the row; D103),
  then / sqrt(d') and * scale as two roundings;
- the rounding's uniforms are drawn by numpy from the round's generator in
  the same order (the whole chunk, then each retry's pending rows), and the
  retries are `dpmech.quantize`'s own loop.

Only the simulator uses it: a device runs `dpmech` (no compiler on a
phone, and its cost is one vector a round). Speed: see
docs/performance.md ("The DP mechanism in the simulator").
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from dpmech.mechanism import MechanismConfig, quantize
from dpmech.quantize import MAX_TRIES, redraw_above_bound, squared_norms
from dpmech.rotation import rotation_signs

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Fn = TypeVar("Fn", bound=Callable[..., Any])
_BLOCK = 1 << 11  # stages h < _BLOCK run block by block (16 KB of float64: in L1)


def _jit(f: Fn) -> Fn:
    """`f` compiled by numba where it is installed (cached on disk beside the
    module, or in NUMBA_CACHE_DIR; compiled afresh in each process where no
    cache location is writable), else `f` itself."""
    try:
        import numba
    except ImportError:
        return f
    try:
        return numba.njit(cache=True, nogil=True)(f)  # type: ignore[return-value]
    except RuntimeError:  # no writable cache location (a read-only install)
        return numba.njit(nogil=True)(f)  # type: ignore[return-value]


# The butterflies. Each pass runs two or three consecutive stages on the
# coordinates it loads (radix 4 and 8), which is the same sum and difference
# of the same two numbers for every coordinate at every stage as one stage at
# a time: the result is the same bit for bit, with a half or a third of the
# passes over the row.

@_jit
def _radix2(row: F64, h: int, start: int, span: int) -> None:
    """Stage h on row[start:start+span]: (a, b) -> (a + b, a - b) for pairs h apart."""
    for base in range(start, start + span, 2 * h):
        for j in range(base, base + h):
            a = row[j]
            b = row[j + h]
            row[j] = a + b
            row[j + h] = a - b


@_jit
def _radix4(row: F64, h: int, start: int, span: int) -> None:
    """Stages h and 2h on row[start:start+span] in one pass."""
    for base in range(start, start + span, 4 * h):
        for j in range(base, base + h):
            x0, x1, x2, x3 = row[j], row[j + h], row[j + 2 * h], row[j + 3 * h]
            s0, d0, s1, d1 = x0 + x1, x0 - x1, x2 + x3, x2 - x3
            row[j], row[j + 2 * h] = s0 + s1, s0 - s1
            row[j + h], row[j + 3 * h] = d0 + d1, d0 - d1


@_jit
def _radix8(row: F64, h: int, start: int, span: int) -> None:
    """Stages h, 2h and 4h on row[start:start+span] in one pass."""
    for base in range(start, start + span, 8 * h):
        for j in range(base, base + h):
            a0, a1, a2, a3 = row[j], row[j + h], row[j + 2 * h], row[j + 3 * h]
            a4, a5, a6, a7 = row[j + 4 * h], row[j + 5 * h], row[j + 6 * h], row[j + 7 * h]
            b0, b1, b2, b3 = a0 + a1, a0 - a1, a2 + a3, a2 - a3  # stage h
            b4, b5, b6, b7 = a4 + a5, a4 - a5, a6 + a7, a6 - a7
            c0, c2, c1, c3 = b0 + b2, b0 - b2, b1 + b3, b1 - b3  # stage 2h
            c4, c6, c5, c7 = b4 + b6, b4 - b6, b5 + b7, b5 - b7
            row[j], row[j + 4 * h] = c0 + c4, c0 - c4  # stage 4h
            row[j + h], row[j + 5 * h] = c1 + c5, c1 - c5
            row[j + 2 * h], row[j + 6 * h] = c2 + c6, c2 - c6
            row[j + 3 * h], row[j + 7 * h] = c3 + c7, c3 - c7


@_jit
def _stages(row: F64, lo: int, hi: int, start: int, span: int, widest: int) -> None:
    """Stages h = lo, 2 lo, ..., hi/2 on row[start:start+span], in order,
    `widest` (4 or 8) stages' radix at most per pass."""
    h = lo
    if widest == 8:
        while 8 * h <= hi:
            _radix8(row, h, start, span)
            h *= 8
    while 4 * h <= hi:
        _radix4(row, h, start, span)
        h *= 4
    while h < hi:
        _radix2(row, h, start, span)
        h *= 2


def _transform_rows(x: F64, factor: F64, signs: F64, root: float, scale: float, out: F64) -> None:
    """out[i] = ((pad(x[i] * factor[i]) * signs) H / root) * scale, root =
    sqrt(d'), with numpy's roundings (a division by root, then a product)."""
    n, d = x.shape
    dp = out.shape[1]
    block = min(_BLOCK, dp)
    for i in range(n):
        row = out[i]
        f = factor[i]
        for j in range(d):
            row[j] = (x[i, j] * f) * signs[j]
        for j in range(d, dp):
            row[j] = 0.0
        # stages h < block block by block (each in cache), then h >= block over the whole row;
        # radix 8 while three stages remain, then 4 and 2 (fewer passes, above all out of cache)
        for start in range(0, dp, block):
            _stages(row, 1, block, start, block, 8 if block >= 8 else 4)
        _stages(row, block, dp, 0, dp, 8)
        for j in range(dp):
            row[j] = (row[j] / root) * scale


def _round_rows(z: F64, u: F64, out: I64, sq: I64, limit: int) -> bool:
    """out = floor(z) + (u < z - floor(z)) and each row's squared norm in
    int64; False (and sq meaningless) when a coordinate is not finite, leaves
    +-2^62, or a rounded value exceeds `limit` (sqrt(int64 max / d'): its
    squares could overflow; then numpy decides)."""
    n, dp = z.shape
    for i in range(n):
        total = 0
        for j in range(dp):
            v = z[i, j]
            if not (abs(v) < 4.611686018427388e18):  # 2^62; also NaN
                return False
            low = np.floor(v)
            r = int(low)
            if u[i, j] < v - low:
                r += 1
            if r > limit or -r > limit:
                return False
            out[i, j] = r
            total += r * r
        sq[i] = total
    return True


@_jit
def _block_squares(row: Any, lo: int, n: int) -> float:
    """A leaf of numpy's pairwise summation, over row[lo:lo+n]'s float64
    squares: fewer than 8 added one by one; up to 128 in 8 running sums
    combined as ((0+1)+(2+3))+((4+5)+(6+7)), then the rest one by one."""
    if n < 8:
        res = 0.0
        for i in range(n):
            v = np.float64(row[lo + i])
            res += v * v
        return res
    a, b = np.float64(row[lo]), np.float64(row[lo + 1])
    c, d = np.float64(row[lo + 2]), np.float64(row[lo + 3])
    e, f = np.float64(row[lo + 4]), np.float64(row[lo + 5])
    g, h = np.float64(row[lo + 6]), np.float64(row[lo + 7])
    r0, r1, r2, r3, r4, r5, r6, r7 = a * a, b * b, c * c, d * d, e * e, f * f, g * g, h * h
    i = 8
    end = n - n % 8
    while i < end:
        a, b = np.float64(row[lo + i]), np.float64(row[lo + i + 1])
        c, d = np.float64(row[lo + i + 2]), np.float64(row[lo + i + 3])
        e, f = np.float64(row[lo + i + 4]), np.float64(row[lo + i + 5])
        g, h = np.float64(row[lo + i + 6]), np.float64(row[lo + i + 7])
        r0 += a * a
        r1 += b * b
        r2 += c * c
        r3 += d * d
        r4 += e * e
        r5 += f * f
        r6 += g * g
        r7 += h * h
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        v = np.float64(row[lo + i])
        res += v * v
        i += 1
    return res


@_jit
def _pairwise_squares(row: Any, n: int, spans: I64, sums: F64) -> float:
    """The sum of row[:n]'s float64 squares as numpy's pairwise summation adds
    them (`np.add.reduce` over a contiguous float64 row): a span of more than
    128 is the sum of its two halves, the first cut to a multiple of 8, and
    smaller spans are `_block_squares`. Walked with explicit stacks instead of
    recursion (numba's on-disk cache cannot load a recursive function):
    `spans` (3, 64) holds each pending span's start, length and state, `sums`
    (64) the halves summed so far; a+b = b+a, so only the tree matters."""
    top = 0
    spans[0, 0], spans[1, 0], spans[2, 0] = 0, n, 0
    depth = 0  # values on `sums`
    while top >= 0:
        lo, m, state = spans[0, top], spans[1, top], spans[2, top]
        if m <= 128:
            sums[depth] = _block_squares(row, lo, m)
            depth += 1
            top -= 1
        elif state == 0:  # split: the first half, then the second, then their sum
            half = m // 2
            half -= half % 8
            spans[2, top] = 1
            spans[0, top + 1], spans[1, top + 1], spans[2, top + 1] = lo + half, m - half, 0
            spans[0, top + 2], spans[1, top + 2], spans[2, top + 2] = lo, half, 0
            top += 2
        else:  # both halves done
            depth -= 1
            sums[depth - 1] = sums[depth - 1] + sums[depth]
            top -= 1
    return sums[0]


def _row_stats(x: Any, clip: float, norms: F64, chunk: F64, total: F64) -> None:
    """norms[i] = the float64 L2 norm of row i as `np.linalg.norm` gives it,
    and total += the rows scaled to clip summed as numpy's `sum(axis=0)`
    adds them (the first row, then each next one), each row scaled by
    min(1, clip / max(norm, 1e-300)) (NaN for a NaN norm). `chunk` (d) is
    scratch for that sum. x may be float32: its values are exact in float64."""
    n, d = x.shape
    spans = np.empty((3, 64), dtype=np.int64)
    sums = np.empty(64)
    for i in range(n):
        norm = math.sqrt(_pairwise_squares(x[i], d, spans, sums))
        norms[i] = norm
        if norm != norm:
            f = norm
        else:
            q = clip / (norm if norm > 1e-300 else 1e-300)
            f = q if q < 1.0 else 1.0
        if i == 0:
            for j in range(d):
                chunk[j] = np.float64(x[i, j]) * f
        else:
            for j in range(d):
                chunk[j] += np.float64(x[i, j]) * f
    if n:
        for j in range(d):
            total[j] += chunk[j]


def _compiled() -> tuple[Callable[..., None], Callable[..., bool], Callable[..., None]] | None:
    """The loops compiled by numba (on first call, cached on disk), or
    None where numba is not installed (the `fast` extra is optional)."""
    if importlib.util.find_spec("numba") is None:
        return None
    return _jit(_transform_rows), _jit(_round_rows), _jit(_row_stats)


_KERNELS = _compiled()


def row_stats(x: npt.NDArray[np.floating[Any]], clip: float, norms: F64, chunk: F64, total: F64) -> None:
    """The rows' float64 L2 norms into `norms` (`np.linalg.norm(x, axis=1)`
    of the float64 rows, bit for bit), and `total` += the rows clipped to
    `clip` summed as `np.multiply(x, factor[:, None]).sum(axis=0)` adds them,
    factor = min(1, clip / max(norm, 1e-300)); `chunk` (len d) is scratch.
    One compiled pass over float32 or float64 rows where numba is installed
    (no float64 copy of the rows), numpy's own operations elsewhere."""
    if _KERNELS is not None and x.dtype in (np.float32, np.float64) and x.flags.c_contiguous:
        _KERNELS[2](x, float(clip), norms, chunk, total)
        return
    x64 = np.asarray(x, dtype=np.float64)
    norms[:] = np.sqrt(np.add.reduce(x64 * x64, axis=1))
    total += (x64 * np.minimum(1.0, clip / np.maximum(norms, 1e-300))[:, None]).sum(axis=0)


def available() -> bool:
    """Whether the compiled path runs here (numba importable)."""
    return _KERNELS is not None


class Workspace:
    """The arrays a chunk of up to `rows` rows of `padded_dim` coordinates is
    quantized in (the rotated rows, their uniforms, the rounded values: 24
    bytes a coordinate), kept from chunk to chunk: a round of thousands of
    devices then touches its memory once instead of mapping fresh pages for
    every chunk. Not shared between threads."""

    def __init__(self, rows: int, padded_dim: int) -> None:
        if rows < 1 or padded_dim < 1:
            raise ValueError(f"a workspace needs rows and coordinates, got ({rows}, {padded_dim})")
        self.z = np.empty((rows, padded_dim), dtype=np.float64)
        self.u = np.empty((rows, padded_dim), dtype=np.float64)
        self.out = np.empty((rows, padded_dim), dtype=np.int64)
        self.sq = np.empty(rows, dtype=np.int64)
        self._signs: tuple[bytes, F64] | None = None

    def fits(self, rows: int, padded_dim: int) -> bool:
        return rows <= self.z.shape[0] and padded_dim == self.z.shape[1]

    def signs(self, rotation_seed: bytes) -> F64:
        """The rotation's signs as float64 (kept for the last seed: a round's chunks share it)."""
        if self._signs is None or self._signs[0] != rotation_seed:
            self._signs = (rotation_seed, rotation_signs(rotation_seed, self.z.shape[1]).astype(np.float64))
        return self._signs[1]


def quantize_rows(update: npt.NDArray[np.floating[Any]], config: MechanismConfig, rotation_seed: bytes, rng: np.random.Generator, *,
                  compiled: bool | None = None, norms: F64 | None = None, work: Workspace | None = None) -> I64:
    """`dpmech.mechanism.quantize(update, config, rotation_seed, rng)` for a
    chunk of rows (n, dim), bit for bit, drawing the same numbers from rng.
    `compiled` None: the compiled path where numba is installed; False: numpy.
    `norms`: the rows' L2 norms as `np.linalg.norm(update, axis=1)` gives
    them, when the caller has them already (else computed here).
    `work`: arrays to quantize in (compiled path); the result is then a view
    of `work`, valid until its next use."""
    kernels = _KERNELS if compiled is not False else None
    if kernels is None:
        if compiled:
            raise RuntimeError("the compiled path needs numba (pip install 'fedmask[fast]')")
        return quantize(np.asarray(update, dtype=np.float64), config, rotation_seed, rng)
    transform_rows, round_rows, _ = kernels
    # float32 rows are read as they are (their values are exact in float64); anything else as float64
    keep = update.dtype in (np.float32, np.float64)
    x = np.ascontiguousarray(update) if keep else np.ascontiguousarray(update, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != config.dim:
        raise ValueError(f"expected rows of length {config.dim}, got shape {x.shape}")
    if norms is None:
        norms = np.linalg.norm(np.asarray(x, dtype=np.float64), axis=1)
    if not np.all(np.isfinite(norms)) and not np.all(np.isfinite(x)):  # only such rows have such norms
        raise ValueError("the update has a NaN or infinite coordinate")
    n = x.shape[0]
    if work is None or not work.fits(n, config.padded_dim):
        work = Workspace(max(n, 1), config.padded_dim)
    factor = np.minimum(1.0, config.clip / np.maximum(norms, np.finfo(np.float64).tiny))
    z, u, out, sq = work.z[:n], work.u[:n], work.out[:n], work.sq[:n]
    transform_rows(x, np.ascontiguousarray(factor), work.signs(rotation_seed), math.sqrt(config.padded_dim),
                   float(config.scale), z)
    rng.random(out=u)  # the draws rng.random(z.shape) would make, into kept memory
    if round_rows(z, u, out, sq, math.isqrt(np.iinfo(np.int64).max // config.padded_dim)):
        squares = [int(s) for s in sq]
    else:  # out of the compiled path's range: numpy's checks, errors and exact squares
        if not np.all(np.isfinite(z)) or float(np.abs(z).max()) >= 2.0 ** 62:
            raise ValueError("a scaled coordinate is not finite or leaves int64")
        low = np.floor(z)
        out = low.astype(np.int64)
        out += u < (z - low)
        squares = squared_norms(out)
    return redraw_above_bound(z, out, squares, config.bound_sq, rng, MAX_TRIES)


__all__ = ["Workspace", "available", "quantize_rows", "row_stats"]
