"""The simulator's compiled steps 1-4 (models/sim/fast_quantize.py) against
`dpmech.mechanism.quantize`, the oracle: the same integers bit for bit and
the generator left in the same state, for rows clipped and not, padded and
not, long enough for the blocked transform, and with retries under a tight
norm bound."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dpmech.calibrate import calibrate
from dpmech.mechanism import quantize
from models.sim import fast_quantize

pytestmark = pytest.mark.skipif(not fast_quantize.available(),
                                reason="numba is not installed (the `fast` extra; the dev extra has it)")


# the lengths take every pass of the transform: radix 2, 4 and 8 within a block, 1 to 6 stages above it
@pytest.mark.parametrize("dim,rows", [(1, 3), (2, 2), (3, 3), (5, 4), (1000, 6), (4096, 3), (5000, 2), (9000, 2),
                                      (53_824, 2), (70_000, 2)])
def test_the_compiled_path_is_dpmechs_bit_for_bit(dim: int, rows: int) -> None:
    rng = np.random.default_rng(dim)
    x = rng.normal(size=(rows, dim)) * 0.05
    x[0] *= 1000  # clipped
    cfg = calibrate(dim=dim, clip=0.1, noise_multiplier=1.0, devices=50, shares=50, bits=32)
    a, b = np.random.default_rng(9), np.random.default_rng(9)
    want = quantize(x, cfg, b"seed/3", a)
    got = fast_quantize.quantize_rows(x, cfg, b"seed/3", b)
    assert got.dtype == np.int64 and np.array_equal(got, want)
    assert a.random() == b.random()  # the same draws were taken
    given = fast_quantize.quantize_rows(x, cfg, b"seed/3", np.random.default_rng(9), norms=np.linalg.norm(x, axis=1))
    assert np.array_equal(given, want)  # the caller's norms (the simulator has them) change nothing


def test_a_kept_workspace_gives_what_fresh_arrays_give() -> None:
    """The simulator quantizes chunk after chunk in one `Workspace`: a
    smaller chunk after a larger one, and a new rotation seed, change
    nothing; a workspace of the wrong length is not used."""
    dim = 3000
    cfg = calibrate(dim=dim, clip=0.1, noise_multiplier=1.0, devices=20, shares=20, bits=32)
    x = np.random.default_rng(5).normal(size=(7, dim)) * 0.05
    work = fast_quantize.Workspace(5, cfg.padded_dim)
    a, b = np.random.default_rng(1), np.random.default_rng(1)
    for rows, seed in ((slice(0, 5), b"r/0"), (slice(5, 7), b"r/0"), (slice(0, 3), b"r/1")):
        want = quantize(x[rows], cfg, seed, a)
        assert np.array_equal(fast_quantize.quantize_rows(x[rows], cfg, seed, b, work=work), want)
    assert a.random() == b.random()
    small = fast_quantize.Workspace(2, cfg.padded_dim)
    assert not small.fits(3, cfg.padded_dim) and not small.fits(2, cfg.padded_dim * 2)
    got = fast_quantize.quantize_rows(x[:3], cfg, b"r/2", np.random.default_rng(3), work=small)
    assert np.array_equal(got, quantize(x[:3], cfg, b"r/2", np.random.default_rng(3)))
    with pytest.raises(ValueError, match="needs rows"):
        fast_quantize.Workspace(0, 8)


def test_retries_under_a_tight_bound_draw_as_dpmech_does() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(16, 300))
    cfg = calibrate(dim=300, clip=1.0, noise_multiplier=1.0, devices=16, shares=16, bits=32)
    tight = dataclasses.replace(cfg, beta=0.97)  # a tight bound: about 1 in 30 tries passes
    a, b = np.random.default_rng(4), np.random.default_rng(4)
    want = quantize(x, tight, b"k", a)
    assert np.array_equal(fast_quantize.quantize_rows(x, tight, b"k", b), want)
    assert a.random() == b.random()


def test_bad_input_fails_as_dpmech_does() -> None:
    cfg = calibrate(dim=8, clip=1.0, noise_multiplier=1.0, devices=4, shares=4, bits=32)
    bad = np.ones((2, 8))
    bad[1, 3] = np.nan
    for compiled in (True, False):
        with pytest.raises(ValueError, match="NaN or infinite"):
            fast_quantize.quantize_rows(bad, cfg, b"k", np.random.default_rng(0), compiled=compiled)
    with pytest.raises(ValueError, match="rows of length 8"):
        fast_quantize.quantize_rows(np.ones((2, 9)), cfg, b"k", np.random.default_rng(0))


def test_rows_out_of_the_compiled_range_are_rounded_by_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled rounding gives up on a coordinate at 2^62 or a square
    that could overflow int64 (checked here on the plain Python loop), and
    numpy's rounding of the same draws takes over, still dpmech's result."""
    z = np.array([[1.5, 2.0 ** 62]])
    assert not fast_quantize._round_rows(z, np.zeros_like(z), np.empty((1, 2), np.int64), np.empty(1, np.int64), 10)
    assert not fast_quantize._round_rows(np.array([[11.0, 0.0]]), np.zeros((1, 2)), np.empty((1, 2), np.int64),
                                         np.empty(1, np.int64), 10)
    assert fast_quantize._KERNELS is not None
    transform, _, stats = fast_quantize._KERNELS
    monkeypatch.setattr(fast_quantize, "_KERNELS", (transform, lambda *args: False, stats))
    rng = np.random.default_rng(3)
    x = rng.normal(size=(5, 700))
    cfg = calibrate(dim=700, clip=0.5, noise_multiplier=1.0, devices=5, shares=5, bits=32)
    a, b = np.random.default_rng(2), np.random.default_rng(2)
    assert np.array_equal(fast_quantize.quantize_rows(x, cfg, b"k", b), quantize(x, cfg, b"k", a))
    assert a.random() == b.random()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("compiled", [True, False])
def test_row_stats_are_numpys_norms_and_clipped_sum(dtype: type, compiled: bool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused pass (numba) gives `np.linalg.norm` of the float64 rows and
    numpy's clipped sum (`sum(axis=0)` of the scaled rows, added to the
    running total) bit for bit, float32 rows included: every row length up
    to 300 (numpy's pairwise summation changes shape at 8 and 128) and the
    simulator's large ones, rows of very different norms and zeros."""
    if compiled and not fast_quantize.available():
        pytest.skip("numba is not installed (the fast extra)")
    if not compiled:
        monkeypatch.setattr(fast_quantize, "_KERNELS", None)
    rng = np.random.default_rng(11)
    for d in [*range(1, 300, 7), 128, 129, 136, 8192, 8193, 118_592, 131_071]:
        n = int(rng.integers(1, 5))
        x: np.ndarray = (rng.standard_normal((n, d)) * rng.uniform(1e-5, 20.0, size=(n, 1))).astype(dtype)
        x[0, : min(d, 3)] = 0.0
        x64 = x.astype(np.float64)
        want = np.linalg.norm(x64, axis=1)
        start = rng.standard_normal(d)
        want_total = start + (x64 * np.minimum(1.0, 0.1 / np.maximum(want, 1e-300))[:, None]).sum(axis=0)
        norms, total = np.empty(n), start.copy()
        fast_quantize.row_stats(x, 0.1, norms, np.empty(d), total)
        assert np.array_equal(norms, want), d
        assert np.array_equal(total, want_total), d
