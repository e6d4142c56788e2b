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
  stage), then / sqrt(d') and * scale as two roundings;
- the rounding's uniforms are drawn by numpy from the round's generator in
  the same order (the whole chunk, then each retry's pending rows), and the
  retries are `dpmech.quantize`'s own loop.

Only the simulator uses it: a device runs `dpmech` (no compiler on a
phone, and its cost is one vector a round). Speed: see
docs/performance.md ("The DP mechanism in the simulator").
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from dpmech.mechanism import MechanismConfig, quantize
from dpmech.quantize import MAX_TRIES, redraw_above_bound, squared_norms
from dpmech.rotation import rotation_signs

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
_BLOCK = 1 << 11  # stages h < _BLOCK run block by block (16 KB of float64: in L1)


def _transform_rows(x: F64, factor: F64, signs: F64, root: float, scale: float, out: F64) -> None:
    """out[i] = ((pad(x[i] * factor[i]) * signs) H / root) * scale, root =
    sqrt(d'), with numpy's roundings (a division by root, then a product)."""
    n, d = x.shape
    dp = out.shape[1]
    for i in range(n):
        row = out[i]
        f = factor[i]
        for j in range(d):
            row[j] = (x[i, j] * f) * signs[j]
        for j in range(d, dp):
            row[j] = 0.0
        block = min(_BLOCK, dp)
        # stages h < block block by block (each in cache), then h >= block over the whole row
        for lo, hi, span in ((1, block, block), (block, dp, dp)):
            for start in range(0, dp, span):
                h = lo
                while h < hi:
                    for base in range(start, start + span, 2 * h):
                        for j in range(base, base + h):
                            a = row[j]
                            b = row[j + h]
                            row[j] = a + b
                            row[j + h] = a - b
                    h *= 2
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


def _compiled() -> tuple[Callable[..., None], Callable[..., bool]] | None:
    """The two loops compiled by numba (on first call, cached on disk), or
    None where numba is not installed (the `fast` extra is optional)."""
    try:
        import numba
    except ImportError:
        return None
    try:  # cached on disk beside the module, or in the user's cache (NUMBA_CACHE_DIR)
        return numba.njit(cache=True, nogil=True)(_transform_rows), numba.njit(cache=True, nogil=True)(_round_rows)
    except RuntimeError:  # no writable cache location (a read-only install): compiled afresh in each process
        return numba.njit(nogil=True)(_transform_rows), numba.njit(nogil=True)(_round_rows)


_KERNELS = _compiled()


def available() -> bool:
    """Whether the compiled path runs here (numba importable)."""
    return _KERNELS is not None


def quantize_rows(update: F64, config: MechanismConfig, rotation_seed: bytes, rng: np.random.Generator, *,
                  compiled: bool | None = None, norms: F64 | None = None) -> I64:
    """`dpmech.mechanism.quantize(update, config, rotation_seed, rng)` for a
    chunk of rows (n, dim), bit for bit, drawing the same numbers from rng.
    `compiled` None: the compiled path where numba is installed; False: numpy.
    `norms`: the rows' L2 norms as `np.linalg.norm(update, axis=1)` gives
    them, when the caller has them already (else computed here)."""
    kernels = _KERNELS if compiled is not False else None
    if kernels is None:
        if compiled:
            raise RuntimeError("the compiled path needs numba (pip install 'fedmask[fast]')")
        return quantize(update, config, rotation_seed, rng)
    transform_rows, round_rows = kernels
    x = np.ascontiguousarray(update, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != config.dim:
        raise ValueError(f"expected rows of length {config.dim}, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("the update has a NaN or infinite coordinate")
    if norms is None:
        norms = np.linalg.norm(x, axis=1)
    factor = np.minimum(1.0, config.clip / np.maximum(norms, np.finfo(np.float64).tiny))
    signs = rotation_signs(rotation_seed, config.padded_dim).astype(np.float64)
    z = np.empty((x.shape[0], config.padded_dim), dtype=np.float64)
    transform_rows(x, np.ascontiguousarray(factor), signs, math.sqrt(config.padded_dim), float(config.scale), z)
    u = rng.random(z.shape)
    out = np.empty(z.shape, dtype=np.int64)
    sq = np.empty(z.shape[0], dtype=np.int64)
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


__all__ = ["available", "quantize_rows"]
