"""The randomised Hadamard rotation: orthogonal, exactly invertible, the same
on every machine for a seed. Oracle: scipy's explicit Hadamard matrix."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import hadamard

from dpmech.rotation import fwht, padded_dimension, rotate, rotation_signs, unrotate


def test_padding_goes_to_the_next_power_of_two() -> None:
    assert [padded_dimension(d) for d in (1, 2, 3, 64, 65, 53_824)] == [1, 2, 4, 64, 128, 65_536]
    with pytest.raises(ValueError):
        padded_dimension(0)


@pytest.mark.parametrize("d", [1, 2, 8, 256])
def test_the_fast_transform_is_the_hadamard_matrix(d: int) -> None:
    rng = np.random.default_rng(d)
    x = rng.integers(-1000, 1000, size=(3, d), dtype=np.int64)
    assert np.array_equal(fwht(x), x @ hadamard(d).T)  # exact in integers
    xf = rng.normal(size=(2, 5, d))
    np.testing.assert_allclose(fwht(xf), xf @ hadamard(d).T, atol=1e-9)


def _stage_by_stage(x: np.ndarray) -> np.ndarray:
    """The textbook transform: stage h = 1, 2, ..., d/2 over the whole row."""
    y = x.copy()
    d, h = y.shape[-1], 1
    while h < d:
        pairs = y.reshape(*y.shape[:-1], d // (2 * h), 2, h)
        a, b = pairs[..., 0, :].copy(), pairs[..., 1, :].copy()
        pairs[..., 0, :], pairs[..., 1, :] = a + b, a - b
        h *= 2
    return y


@pytest.mark.parametrize("d", [4096, 8192, 1 << 15])
def test_long_rows_take_the_matrix_path_with_the_same_sums_bit_for_bit(d: int) -> None:
    """From d' = 4096 a row is transformed as a matrix, transposed in
    between: the same butterflies in the same order, so float results equal
    the textbook order's bit for bit, and integers the Hadamard matrix's."""
    rng = np.random.default_rng(d)
    xf = rng.normal(size=(3, d))
    assert np.array_equal(fwht(xf), _stage_by_stage(xf))
    if d == 4096:
        x = rng.integers(-1000, 1000, size=(2, d), dtype=np.int64)
        assert np.array_equal(fwht(x), x @ hadamard(d).T)


def test_rotation_keeps_norms_and_unrotation_inverts_it() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 1000))
    y = rotate(x, b"round 7")
    assert y.shape == (4, 1024)
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), np.linalg.norm(x, axis=1), rtol=1e-12)
    np.testing.assert_allclose(unrotate(y, b"round 7", 1000), x, atol=1e-12)
    assert not np.allclose(unrotate(y, b"round 8", 1000), x, atol=1e-3)  # another seed, another D


def test_integer_sums_are_unrotated_exactly_before_one_division() -> None:
    """The server's path: an int64 sum is transformed in integers, so the
    only rounding is the final division by sqrt(d') (d' = 4^k: integer)."""
    rng = np.random.default_rng(1)
    total = rng.integers(-2 ** 31, 2 ** 31, size=1024, dtype=np.int64)
    signs = rotation_signs(b"s", 1024).astype(np.int64)
    expected = (hadamard(1024).astype(np.int64) @ total) * signs / 32.0
    np.testing.assert_array_equal(unrotate(total, b"s", 1024), expected)


def test_signs_depend_only_on_the_seed() -> None:
    a = rotation_signs(b"seed", 65_536)
    assert a.dtype == np.int8 and set(np.unique(a)) == {-1, 1}
    assert np.array_equal(a, rotation_signs(b"seed", 65_536))
    assert np.array_equal(a[:1024], rotation_signs(b"seed", 1024))  # a prefix of the same stream
    assert abs(int(a.sum())) < 5 * 256  # balanced: |sum| < 5 sqrt(d)
    assert not np.array_equal(a, rotation_signs(b"seee", 65_536))


def test_a_rotated_spike_is_flat() -> None:
    """What the rotation is for: all the norm in one coordinate becomes
    +-||x|| / sqrt(d') in every coordinate."""
    x = np.zeros(65_536)
    x[123] = 5.0
    y = rotate(x, b"any")
    np.testing.assert_allclose(np.abs(y), 5.0 / 256)
