"""A device's update to integers: L2 clip, scale, randomised rounding under a norm bound.

Steps 1, 3 and 4 of the mechanism (step 2, the rotation, is
`dpmech.rotation`; step 5, the noise, `dpmech.exact_sampler`):

1. clip:   x <- x * min(1, c / ||x||_2)                      (model units)
3. scale:  z = s * R x, so ||z||_2 <= s c =: C               (integer units)
4. round:  each z_j to floor(z_j) + Bernoulli(z_j - floor(z_j)), unbiased;
           drawn again, whole, until ||round(z)||_2^2 <= B.

The conditional norm bound B (Kairouz, Liu and Steinke, "The Distributed
Discrete Gaussian Mechanism for Federated Learning with Secure Aggregation",
ICML 2021, Section 4.1) for a vector of norm <= C in d' coordinates is

    B = floor(min( (C + sqrt(d'))^2,
                   C^2 + d'/4 + sqrt(2 ln(1/beta)) (C + sqrt(d')/2) )).

The first term holds for every rounding (each coordinate moves by < 1); the
second holds with probability >= 1 - beta per try, so the expected number of
tries is at most 1/(1 - beta). Privacy rests on B alone and not on that
lemma: the rounded vector that leaves the device has squared norm <= B,
checked in exact integer arithmetic, so sqrt(B) is the sum's L2 sensitivity
to one device's input, whatever the rounding randomness was.

The rounding's randomness is a numpy Generator: it is not part of the
privacy guarantee (the noise is).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from dpmech.random_source import I64

F64 = npt.NDArray[np.float64]
DEFAULT_BETA = math.exp(-0.5)  # the papers' choice: at most 1/(1 - beta) = 2.5 tries on average
MAX_TRIES = 10_000


def clip_l2(x: F64, clip: float) -> F64:
    """Each row of x (..., d) scaled to L2 norm at most `clip` (a new array)."""
    if not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"clip must be a positive finite number, got {clip}")
    if not np.all(np.isfinite(x)):
        raise ValueError("the update has a NaN or infinite coordinate")
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    factor = np.minimum(1.0, clip / np.maximum(norms, np.finfo(np.float64).tiny))
    return np.asarray(x * factor, dtype=np.float64)


def norm_bound_sq(scaled_clip: float, padded_dim: int, beta: float = DEFAULT_BETA) -> int:
    """B, the largest squared L2 norm a rounded vector may have (module doc)."""
    if not (math.isfinite(scaled_clip) and scaled_clip > 0):
        raise ValueError(f"the scaled clip must be a positive finite number, got {scaled_clip}")
    if padded_dim < 1:
        raise ValueError(f"dimension must be >= 1, got {padded_dim}")
    if not 0 <= beta < 1:
        raise ValueError(f"beta must be in [0, 1), got {beta}")
    root_d = math.sqrt(padded_dim)
    always = (scaled_clip + root_d) ** 2
    if beta == 0:
        return math.floor(always)
    likely = scaled_clip ** 2 + padded_dim / 4 + math.sqrt(2 * math.log(1 / beta)) * (scaled_clip + root_d / 2)
    return math.floor(min(always, likely))


def squared_norms(v: I64) -> list[int]:
    """Each row's squared L2 norm in Python integers (no overflow)."""
    rows = v.reshape(-1, v.shape[-1])
    limit = math.isqrt(np.iinfo(np.int64).max // max(1, v.shape[-1]))
    if rows.size == 0 or max(-int(rows.min()), int(rows.max())) <= limit:
        return [int(s) for s in np.einsum("ij,ij->i", rows, rows)]
    return [sum(int(e) * int(e) for e in row) for row in rows]


def round_randomly(z: F64, rng: np.random.Generator) -> I64:
    """floor(z) + Bernoulli(z - floor(z)) for every coordinate (unbiased)."""
    low = np.floor(z)
    up = rng.random(z.shape) < (z - low)
    rounded = low.astype(np.int64)
    rounded += up
    return rounded


def round_within_bound(z: F64, bound_sq: int, rng: np.random.Generator, max_tries: int = MAX_TRIES) -> I64:
    """Each row of z (..., d') rounded randomly, drawn again until its squared
    norm is <= bound_sq. RuntimeError after `max_tries` failed tries of a row
    (with B from `norm_bound_sq` and ||z|| <= C, probability <= beta^max_tries)."""
    if not np.all(np.isfinite(z)) or (z.size and float(np.abs(z).max()) >= 2.0 ** 62):
        raise ValueError("a scaled coordinate is not finite or leaves int64")
    rows = z.reshape(-1, z.shape[-1])
    out = round_randomly(rows, rng)
    return redraw_above_bound(rows, out, squared_norms(out), bound_sq, rng, max_tries).reshape(z.shape)


def redraw_above_bound(rows: F64, out: I64, squares: list[int], bound_sq: int, rng: np.random.Generator,
                       max_tries: int = MAX_TRIES) -> I64:
    """The tries after the first: `out` (n, d'), the first rounding of
    `rows`, with its rows' squared norms `squares`; every row above bound_sq
    is rounded again (the pending rows together, in order) until none is.
    Returns `out`, changed in place."""
    pending = [i for i, s in enumerate(squares) if s > bound_sq]
    tries = 1
    while pending:
        if tries >= max_tries:
            raise RuntimeError(f"{len(pending)} row(s) still above the norm bound after {tries} roundings: "
                               "is the input clipped to the scaled clip?")
        again = round_randomly(rows[pending], rng)
        fine = [s <= bound_sq for s in squared_norms(again)]
        for i, ok, row in zip(pending, fine, again):
            if ok:
                out[i] = row
        pending = [i for i, ok in zip(pending, fine) if not ok]
        tries += 1
    return out
