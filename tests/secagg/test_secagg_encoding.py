"""Fixed-point encoding: known answers, the no-wrap rule, rounding, decoding."""

from __future__ import annotations

import numpy as np
import pytest

from secagg.encoding import FixedPointEncoding
from secagg.errors import SecAggConfigError, EncodingRangeError


def test_known_answer_deterministic_rounding() -> None:
    # n=3, w=8: max_level = floor(255 / 3) = 85, scale = 85 / 2 = 42.5.
    enc = FixedPointEncoding.for_cohort(3, clip=1.0, modulus_bits=8)
    assert (enc.modulus_bits, enc.max_level, enc.scale) == (8, 85, 42.5)
    x = np.array([-1.0, 0.0, 1.0, 0.5, 2.0, -3.0, 0.01])
    # v = (x + 1) * 42.5 = [0, 42.5, 85, 63.75, 85 (clipped), 0 (clipped), 42.925]; round half up.
    assert enc.encode(x).tolist() == [0, 43, 85, 64, 85, 0, 43]
    assert enc.encode(x).dtype == np.uint32


def test_known_answer_stochastic_rounding() -> None:
    enc = FixedPointEncoding.for_cohort(3, clip=1.0, modulus_bits=8)
    x = np.array([0.0, 0.5, -0.25, 0.9])
    u = np.random.default_rng(7).random(4)  # the same draws the encoder makes
    v = (x + 1.0) * 42.5
    expected = np.floor(v + u).astype(np.uint32)
    assert enc.encode(x, np.random.default_rng(7)).tolist() == expected.tolist()


def test_default_uses_32_bits_and_never_wraps() -> None:
    enc = FixedPointEncoding.for_cohort(100, clip=1.0)
    assert enc.modulus_bits == 32
    assert enc.max_level == (2**32 - 1) // 100
    top = enc.encode(np.full(5, 1e9))
    assert top.tolist() == [enc.max_level] * 5
    assert 100 * int(top[0]) < 2**32


def test_precision_picks_the_fewest_bits() -> None:
    enc = FixedPointEncoding.for_cohort(1000, clip=1.0, precision=1e-6)
    # 2c / step = 2e6 levels, times n = 2e9 < 2^31.
    assert enc.modulus_bits == 31
    assert enc.step <= 1e-6
    assert 1000 * enc.max_level < 2**31


def test_refuses_a_configuration_that_could_wrap() -> None:
    with pytest.raises(EncodingRangeError):
        FixedPointEncoding.for_cohort(1000, clip=10.0, precision=1e-6)  # needs 35 bits
    with pytest.raises(EncodingRangeError):
        FixedPointEncoding.for_cohort(10, clip=1.0, precision=1e-3, modulus_bits=8)
    with pytest.raises(EncodingRangeError):
        FixedPointEncoding.for_cohort(10, clip=1.0, modulus_bits=40)
    with pytest.raises(EncodingRangeError):
        FixedPointEncoding(1.0, 10, 8, 26)  # 10 * 26 = 260 >= 256
    with pytest.raises(EncodingRangeError):
        FixedPointEncoding.for_cohort(300, clip=1.0, modulus_bits=8)  # max_level 0


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_bad_clip(bad: float) -> None:
    with pytest.raises(SecAggConfigError):
        FixedPointEncoding.for_cohort(5, clip=bad)


def test_sum_and_mean_decode() -> None:
    n, L = 7, 50
    enc = FixedPointEncoding.for_cohort(n, clip=2.0)
    x = np.random.default_rng(1).uniform(-3, 3, size=(n, L))
    encoded = np.stack([enc.encode(row, np.random.default_rng(i)) for i, row in enumerate(x)])
    s = encoded.sum(axis=0, dtype=np.uint32)
    clipped = np.clip(x, -2, 2)
    np.testing.assert_allclose(enc.decode_sum(s, n), clipped.sum(0), atol=n * enc.step)
    np.testing.assert_allclose(enc.decode_mean(s, n), clipped.mean(0), atol=enc.step)


def test_stochastic_rounding_is_unbiased() -> None:
    enc = FixedPointEncoding.for_cohort(2, clip=1.0, modulus_bits=6)  # coarse: max_level 31
    x = np.full(200_000, 0.123)
    q = enc.encode(x, np.random.default_rng(3)).astype(np.float64)
    exact = (0.123 + 1.0) * enc.scale
    assert abs(q.mean() - exact) < 0.01
    assert set(np.unique(q)) == {np.floor(exact), np.ceil(exact)}


def test_input_checks() -> None:
    enc = FixedPointEncoding.for_cohort(2, clip=1.0)
    with pytest.raises(ValueError):
        enc.encode(np.array([0.0, np.nan]))
    with pytest.raises(TypeError):
        enc.encode(np.array([1, 2]))
    with pytest.raises(TypeError):
        enc.encode(np.zeros((2, 2)))
    assert enc.encode(np.array([np.inf, -np.inf])).tolist() == [enc.max_level, 0]
    with pytest.raises(ValueError):
        enc.decode_sum(np.zeros(3, np.uint32), 0)
    with pytest.raises(ValueError):
        enc.decode_sum(np.zeros(3, np.uint32), 3)
    with pytest.raises(TypeError):
        enc.decode_sum(np.zeros(3, np.int64), 1)
