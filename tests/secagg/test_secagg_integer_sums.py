"""Integer limbs for exact sums beside the fixed-point update (secagg/integer_sums.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from secagg.encoding import FixedPointEncoding
from secagg.errors import EncodingRangeError
from secagg.integer_sums import IntegerRangeError, IntegerSumEncoding


@pytest.mark.parametrize("n", [2, 3, 100, 1000, 30_000])
@pytest.mark.parametrize("w", [16, 24, 32])
def test_limbs_are_the_widest_that_cannot_wrap(n: int, w: int) -> None:
    enc = IntegerSumEncoding.for_encoding(FixedPointEncoding.for_cohort(n, clip=1.0, modulus_bits=w))
    assert n * enc.limb_max <= (1 << w) - 1  # n devices' limbs never wrap 2^w
    assert n * ((1 << (enc.limb_bits + 1)) - 1) > (1 << w) - 1  # one bit more could


def test_the_documented_widths() -> None:
    widths = {n: IntegerSumEncoding.for_encoding(FixedPointEncoding.for_cohort(n, clip=1.0)).limb_bits
              for n in (2, 1000, 100_000)}
    assert widths == {2: 31, 1000: 22, 100_000: 15}


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 60),
    bits=st.sampled_from([1, 5, 22, 31]),
    bounds=st.lists(st.integers(1, 2**62), min_size=1, max_size=5),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_sum_of_limbs_decodes_to_the_exact_integer_sum(n, bits, bounds, seed) -> None:
    enc = IntegerSumEncoding(bits)
    rng = np.random.default_rng(seed)
    values = [[int(rng.integers(0, b, endpoint=True)) if b < 2**62 else int(b) for b in bounds] for _ in range(n)]
    limbs = np.stack([enc.encode(v, bounds) for v in values])
    assert limbs.shape == (n, enc.coordinates(bounds)) and int(limbs.max()) <= enc.limb_max
    total = limbs.sum(axis=0, dtype=np.uint64)
    if int(total.max()) >= 1 << 32:  # only the cohort sizes the round's encoding allows are exact
        return
    got = enc.decode(total.astype(np.uint32), bounds, n)
    assert got == [sum(v[i] for v in values) for i in range(len(bounds))]


def test_values_outside_their_range_are_refused_when_encoding() -> None:
    enc = IntegerSumEncoding(8)
    with pytest.raises(ValueError):
        enc.encode([5], [4])
    with pytest.raises(ValueError):
        enc.encode([-1], [4])
    with pytest.raises(EncodingRangeError):
        IntegerSumEncoding(32)


def test_out_of_range_sums_are_refused_when_decoding() -> None:
    enc = IntegerSumEncoding(8)
    bounds = [300]  # two limbs of 8 bits
    honest = enc.encode([300], bounds) + enc.encode([299], bounds)
    assert enc.decode(honest, bounds, 2) == [599]
    with pytest.raises(IntegerRangeError, match="limb 0"):
        enc.decode(np.array([2 * 255 + 1, 0], dtype=np.uint32), bounds, 2)
    with pytest.raises(IntegerRangeError, match="total"):
        enc.decode(np.array([0, 3], dtype=np.uint32), bounds, 2)  # 768 > 2 x 300
    with pytest.raises(IntegerRangeError):
        enc.decode(np.array([1, 0], dtype=np.uint32), bounds, 0)  # nothing counted, something summed
