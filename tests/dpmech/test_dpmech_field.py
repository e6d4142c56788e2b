"""Centred arithmetic mod 2^w is exact, and the bound on a sum wrapping is
an upper bound (checked by simulation) that refuses small fields."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpmech import fast_sampler
from dpmech.field import check_field, from_unsigned, overflow_bound, smallest_bits, to_unsigned, wrap
from dpmech.quantize import norm_bound_sq, round_within_bound
from dpmech.rotation import rotate


def test_wrap_gives_the_centred_representative() -> None:
    x = np.array([-9, -8, -1, 0, 7, 8, 9, 2 ** 40], dtype=np.int64)
    assert wrap(x, 4).tolist() == [7, -8, -1, 0, 7, -8, -7, 0]
    assert from_unsigned(to_unsigned(x, 4), 4).tolist() == wrap(x, 4).tolist()
    with pytest.raises(ValueError, match="bits"):
        wrap(x, 63)


@settings(max_examples=60, deadline=None)
@given(bits=st.integers(2, 32), devices=st.integers(1, 12), seed=st.integers(0, 2 ** 32 - 1))
def test_a_sum_of_residues_in_uint32_words_is_the_wrapped_true_sum(bits: int, devices: int, seed: int) -> None:
    """What secure aggregation does (uint32 words, mod 2^32, of which 2^w is
    a divisor) decodes to the true sum, bit for bit, whenever that sum is in
    range, and to its centred residue otherwise: values wrap, never clip."""
    rng = np.random.default_rng(seed)
    half = 1 << (bits - 1)
    x = rng.integers(-4 * half, 4 * half, size=(devices, 16), dtype=np.int64)  # wrap on the device too
    words = [to_unsigned(wrap(row, bits), bits).astype(np.uint32) for row in x]
    total = np.zeros(16, dtype=np.uint32)
    for w in words:
        total += w  # uint32 wraparound
    decoded = from_unsigned(total, bits)
    true = x.sum(axis=0)
    assert np.array_equal(decoded, wrap(true, bits))
    inside = (true >= -half) & (true < half)
    assert np.array_equal(decoded[inside], true[inside])


def test_the_overflow_bound_holds_for_worst_case_inputs() -> None:
    """n devices all sending the same spike (the sum's norm is n c, the most
    it can be), rotated, rounded and noised: the observed frequency of a
    wrapped coordinate stays under the bound, at a w where the bound is
    about 10%."""
    rng = np.random.default_rng(0)
    n, d, c, sigma2 = 8, 256, 200.0, Fraction(400)
    bits = next(w for w in range(2, 40) if overflow_bound(n, c, d, float(sigma2), w) <= 0.1)
    assert overflow_bound(n, c, d, float(sigma2), bits) > 1e-4  # not vacuous at this w
    bound = norm_bound_sq(c, d)
    half = 1 << (bits - 1)
    trials, wrapped = 400, 0
    for t in range(trials):
        spike = np.zeros(d)
        spike[t % d] = c
        rows = round_within_bound(rotate(np.broadcast_to(spike, (n, d)), f"round {t}".encode()), bound, rng)
        true = rows.sum(axis=0) + fast_sampler.sum_of_discrete_gaussians(rng, n, d, sigma2)
        wrapped += bool(np.any((true < -half) | (true >= half)))
    assert wrapped / trials <= overflow_bound(n, c, d, float(sigma2), bits)


def test_a_field_too_small_is_refused_with_the_size_that_would_fit() -> None:
    # By hand: v = (100 * 1e4)^2 / 65536 + 100 * 1e6 = 1.153e8; the bound is
    # <= 1e-9 once (L - 100)^2 >= 2 v ln(2 * 65536 / 1e-9) = 7.49e9, i.e.
    # L = 2^(w-1) >= 86,640: w = 18.
    need = smallest_bits(100, 1e4, 65_536, 1e6, 1e-9)
    assert need == 18
    assert check_field(100, 1e4, 65_536, 1e6, need, 1e-9) <= 1e-9
    with pytest.raises(ValueError, match=f"too small for 100 devices.*need w >= {need} bits"):
        check_field(100, 1e4, 65_536, 1e6, need - 1, 1e-9)
    with pytest.raises(ValueError, match="no field up to 2\\^62"):
        check_field(10, 1e18, 4, 1.0, 62, 1e-9)
    assert overflow_bound(2 ** 20, 1.0, 4, 1.0, 21) == 1.0  # more devices than the half-range: no bound
