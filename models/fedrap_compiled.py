"""FedRAP's local training of a chunk of devices as one compiled loop (numba): the
`kernel="compiled"` option of `models.fedrap.FedRAP` (D97).

`train_chunk` does what `FedRAP._bce_epochs` and `FedRAP._split_step` do for the
devices of one chunk, device by device, without a temporary table:

- every epoch visits the device's training positives in their flat order, then
  the negatives drawn that epoch in item order (torch's sample order), each
  negative weighted by how often it was drawn;
- the item steps accumulate in one (m, k) scratch table A, nonzero only on the
  rows the device sampled; the split step then writes the device's new D_i and
  its update in one pass over its m rows, and sets A back to zero where it was
  touched.

Contract: the same maths in float32 as the torch path. The sums are taken in
another order (the dot products are vectorised: numba's `reassoc` and
`contract` flags), so results differ from torch's by float32 rounding only:
`tests/models/test_fedrap_compiled.py` checks every variant against the
torch path. NaN and infinity propagate as they do in torch (no `nnan`/`ninf`
flag). CPU only; numba is the optional `fast` extra (pinned in
constraints.txt; the dev extra has it).
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import torch

F32 = npt.NDArray[np.float32]
_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}  # no nnan / ninf: NaN and inf stay visible


def _train_devices(pos_item: npt.NDArray[np.int64], pos_ptr: npt.NDArray[np.int64], pos_w: F32,
                   negc: npt.NDArray[np.uint8], u: F32, bias: F32, D: F32, C: F32, cb: F32, d_out: F32, upd: F32,
                   n_per: F32, lr: F32, flags: npt.NDArray[np.bool_], A: F32, touched: npt.NDArray[np.bool_],
                   cbi: F32, emb: F32, gu: F32, total: npt.NDArray[np.float64]) -> None:
    """Train devices 0 .. bc - 1 of the chunk (rows of u, bias, D, d_out, upd, n_per).

    lr: [lr_w, lr_u, lr_b, lr_i, lr_d, lambda, t_c, t_d, weight_decay_u,
    weight_decay_d, update_scale]; flags: [has_c, has_d, has_bias, has_weights, summed].
    A (m, k) and touched (m,) come in zero and leave zero; cbi (m,), emb (k,),
    gu (k,) are scratch. summed: each device's update (the float32 value upd's row
    would hold) is added in float64 to total (update_dim,), device by device, and upd
    is not written."""
    bc, k = u.shape
    n_epochs, m = negc.shape[0], negc.shape[2]
    lr_w, lr_u, lr_b, lr_i, lr_d, lam, t_c, t_d, wd_u, wd_d, scale = (
        lr[0], lr[1], lr[2], lr[3], lr[4], lr[5], lr[6], lr[7], lr[8], lr[9], lr[10])
    has_c, has_d, has_bias, has_w, summed = flags[0], flags[1], flags[2], flags[3], flags[4]
    one = np.float32(1.0)
    for i in range(bc):
        if has_bias:
            cbi[:] = cb
        inv_n = one / n_per[i]
        p0, n_pos = pos_ptr[i], pos_ptr[i + 1] - pos_ptr[i]
        for e in range(n_epochs):
            gu[:] = 0.0
            g_dev = np.float32(0.0)
            for s in range(n_pos + m):
                if s < n_pos:
                    j = pos_item[p0 + s]
                else:
                    j = s - n_pos
                    if negc[e, i, j] == 0:
                        continue
                # the row of W = D_i + (C_i - C) + C at the epoch's start, and the logit
                z = np.float32(0.0)
                for kk in range(k):
                    v = A[j, kk] * (-lr_w)
                    if has_d:
                        v += D[i, j, kk]
                    if has_c:
                        v += C[j, kk]
                    emb[kk] = v
                    z += v * u[i, kk]
                z += bias[i]
                if has_bias:
                    z += cbi[j]
                p = one / (one + np.exp(-z))
                if s < n_pos:  # a positive: p - 1 (times its recency weight)
                    g = p - one
                    if has_w:
                        g = g * pos_w[p0 + s]
                else:  # a negative drawn c times: c p
                    g = p * np.float32(negc[e, i, j])
                for kk in range(k):
                    gu[kk] += emb[kk] * g
                    A[j, kk] += u[i, kk] * g
                touched[j] = True
                g_dev += g
                if has_bias:
                    cbi[j] += (-lr_b) * g
            if wd_u > 0:
                for kk in range(k):
                    gu[kk] += wd_u * u[i, kk] * n_per[i]
            for kk in range(k):
                u[i, kk] -= lr_u * (gu[kk] * inv_n)
            bias[i] -= lr_u * (g_dev * inv_n)
        # the split step on every row (A is zero on the untouched ones): ascent on
        # lambda ||D_i - C_i||^2 and the prox of wd/2 ||D_i||^2, as FedRAP._split_step
        two_l_d = np.float32(2.0) * lam * t_d
        two_l_c = np.float32(2.0) * lam * t_c
        shrink = one + t_d * wd_d
        for j in range(m):
            for kk in range(k):
                a = A[j, kk]
                dn = np.float32(0.0)
                dc = a * (-lr_i)
                if has_d:
                    dn = D[i, j, kk] + (-lr_d) * a
                    if has_c and lam > 0:
                        delta = (dn - dc) - C[j, kk]
                        if wd_d > 0:
                            dn = dn / shrink
                        dn += two_l_d * delta
                        dc -= two_l_c * delta
                    elif wd_d > 0:
                        dn = dn / shrink
                    d_out[i, j, kk] = dn
                if has_c:
                    if summed:
                        total[j * k + kk] += np.float64(dc / scale)
                    else:
                        upd[i, j * k + kk] = dc / scale
            if touched[j]:
                A[j, :] = 0.0
                touched[j] = False
        if has_bias:
            for j in range(m):
                if summed:
                    total[m * k + j] += np.float64((cbi[j] - cb[j]) / scale)
                else:
                    upd[i, m * k + j] = (cbi[j] - cb[j]) / scale


@functools.cache
def _compiled() -> Callable[..., None] | None:
    """The loop compiled by numba (on first call, cached on disk), or None where
    numba is not installed (the `fast` extra is optional). Imported on first use,
    so that importing FedRAP does not import numba."""
    try:
        import numba
    except ImportError:
        return None
    try:  # cached on disk beside the module, or in the user's cache (NUMBA_CACHE_DIR)
        return numba.njit(cache=True, nogil=True, fastmath=_FASTMATH)(_train_devices)
    except RuntimeError:  # no writable cache location (a read-only install): compiled afresh in each process
        return numba.njit(nogil=True, fastmath=_FASTMATH)(_train_devices)


KERNELS: tuple[str, ...] = ("torch", "compiled")  # FedRAP's `kernel` option


def check_kernel(kernel: str) -> str:
    """`kernel` if it is one of KERNELS and runs here; ValueError otherwise."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown FedRAP kernel {kernel!r}; expected one of {KERNELS}")
    if kernel == "compiled" and not available():
        raise ValueError("FedRAP's compiled kernel needs numba: pip install 'fedmask[fast]'")
    return kernel


def available() -> bool:
    """Whether the compiled loop runs here (numba importable)."""
    return importlib.util.find_spec("numba") is not None


def _np(t: torch.Tensor | None, dtype: type, shape: tuple[int, ...] = (0,)) -> npt.NDArray[np.generic]:
    """A CPU tensor's numpy view (no copy when it is contiguous), or an empty array for None."""
    if t is None:
        return np.zeros(shape, dtype=dtype)
    return np.ascontiguousarray(t.numpy(), dtype=dtype)


def train_chunk(*, pos_item: torch.Tensor, pos_counts: torch.Tensor, pos_w: torch.Tensor | None,
                negc: torch.Tensor, u: torch.Tensor, bias: torch.Tensor, D: torch.Tensor | None,
                C: torch.Tensor | None, cb: torch.Tensor | None, d_out: torch.Tensor | None, upd: torch.Tensor,
                n_per: torch.Tensor, rates: tuple[float, ...], scratch: torch.Tensor,
                total: torch.Tensor | None = None) -> None:
    """Train one chunk in place: u, bias (bc, k), (bc,), d_out (bc, m, k) and upd
    (bc, update_dim) are the chunk's rows of the round's outputs (written).
    total: a float64 (update_dim,) CPU sum the devices' updates are added to, in
    device order, instead of writing upd (then upd may have no columns).

    pos_item: the chunk's training positives, device-major; pos_counts (bc,): how
    many each device has; pos_w: their recency weights (None: off); negc (E, bc, m):
    the negative counts; D: the devices' personal tables (None: no D); C, cb: the
    global tables (None: not in this variant); rates: (lr_w, lr_u, lr_b, lr_i, lr_d,
    lambda, t_c, t_d, weight_decay_u, weight_decay_d, update_scale); scratch: a
    float32 (m, k) CPU table, overwritten."""
    kernel = _compiled()
    if kernel is None:
        raise RuntimeError("FedRAP's compiled kernel needs numba (pip install 'fedmask[fast]')")
    bc, k = u.shape
    m = negc.shape[2]
    ptr = np.zeros(bc + 1, dtype=np.int64)
    np.cumsum(pos_counts.numpy(), out=ptr[1:])
    a = scratch.numpy()
    a.fill(0.0)
    outs = (u.numpy(), bias.numpy(), upd.numpy())
    if total is not None and (total.numpy().dtype != np.float64 or not total.is_contiguous()):
        raise ValueError("the sum of the updates must be a contiguous float64 table")
    if not all(o.flags.c_contiguous for o in outs) or (d_out is not None and not d_out.is_contiguous()):
        raise ValueError("the chunk's output rows must be contiguous (they are written in place)")
    kernel(_np(pos_item, np.int64), ptr, _np(pos_w, np.float32), _np(negc, np.uint8), outs[0], outs[1],
            _np(D, np.float32, (0, m, k)), _np(C, np.float32, (0, k)), _np(cb, np.float32),
            d_out.numpy() if d_out is not None else np.zeros((0, m, k), np.float32), outs[2], _np(n_per, np.float32),
            np.asarray(rates, dtype=np.float32), np.array([C is not None, D is not None, cb is not None,
                                                          pos_w is not None, total is not None]),
            a, np.zeros(m, np.bool_), np.zeros(m, np.float32), np.zeros(k, np.float32), np.zeros(k, np.float32),
            total.numpy() if total is not None else np.zeros(0, np.float64))


__all__ = ["KERNELS", "available", "check_kernel", "train_chunk"]
