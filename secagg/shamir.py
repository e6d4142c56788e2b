"""Shamir t-of-n secret sharing over a prime field, with Python ints.

The protocol's field is GF(p), p = 2^256 + 297, the smallest prime above
2^256: every 32-byte secret (b_u, s_u^SK) is an element as is, with no
reduction or bias. Shares are 33-byte big-endian elements (`ELEMENT_BYTES`).
Device id i holds the share at x = i + 1 (x = 0 is the secret).

Several secrets shared to the same holders are split in one call (the same
x-coordinates), and reconstruction computes the Lagrange coefficients at 0
for one set of x-coordinates once (`lagrange_at_zero`, cached) and reuses
them for every secret with that responder set.

Every function takes `prime` so tests can check tiny fields by hand.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from secagg.randomness import RandomSource

PRIME = (1 << 256) + 297
ELEMENT_BYTES = 33
SECRET_BYTES = 32


def x_of(device_id: int) -> int:
    """The x-coordinate of a device's share."""
    return device_id + 1


def random_element(rand: RandomSource, prime: int = PRIME) -> int:
    """Uniform in [0, prime) up to statistical distance 2^-128."""
    nbytes = (prime.bit_length() + 7) // 8 + 16
    return int.from_bytes(rand(nbytes), "big") % prime


def evaluate(coefficients: Sequence[int], xs: Sequence[int], prime: int = PRIME) -> list[int]:
    """f(x) mod prime for each x, f = sum_j coefficients[j] * x^j (Horner).
    Reduces only every 16 steps: the x are small, so the partial values grow
    by a few bits per step and big-number reductions are the costly part."""
    out = []
    rev = coefficients[::-1]
    for x in xs:
        acc = 0
        for j, c in enumerate(rev, 1):
            acc = acc * x + c
            if not j & 15:
                acc %= prime
        out.append(acc % prime)
    return out


def split(
    secrets: Sequence[int],
    xs: Sequence[int],
    threshold: int,
    rand: RandomSource,
    prime: int = PRIME,
) -> list[list[int]]:
    """Shares of each secret at each x: result[j][i] = f_j(xs[i]), where f_j
    has degree threshold - 1, f_j(0) = secrets[j] and uniform other
    coefficients. Any `threshold` shares determine a secret; fewer reveal
    nothing."""
    if not 1 <= threshold <= len(xs):
        raise ValueError(f"threshold {threshold} outside 1..{len(xs)}")
    if len(set(xs)) != len(xs) or any(not 0 < x < prime for x in xs):
        raise ValueError("x-coordinates must be distinct and non-zero mod p")
    out = []
    for s in secrets:
        if not 0 <= s < prime:
            raise ValueError("secret outside the field")
        coefficients = [s] + [random_element(rand, prime) for _ in range(threshold - 1)]
        out.append(evaluate(coefficients, xs, prime))
    return out


@functools.lru_cache(maxsize=4096)
def lagrange_at_zero(xs: tuple[int, ...], prime: int = PRIME) -> tuple[int, ...]:
    """lambda_i = prod_{j != i} x_j / (x_j - x_i) mod prime, so that
    f(0) = sum_i lambda_i f(x_i) for any f of degree < len(xs).
    One modular inverse for the whole set (Montgomery's batch trick)."""
    k = len(xs)
    if len(set(xs)) != k or any(not 0 < x < prime for x in xs):
        raise ValueError("x-coordinates must be distinct and non-zero mod p")
    nums = []
    dens = []
    for i, xi in enumerate(xs):
        num = 1
        den = 1
        for j, xj in enumerate(xs):
            if j != i:
                num = num * xj % prime
                den = den * (xj - xi) % prime
        nums.append(num)
        dens.append(den)
    # Batch inversion of dens.
    prefix = [1] * (k + 1)
    for i, d in enumerate(dens):
        prefix[i + 1] = prefix[i] * d % prime
    inv = pow(prefix[k], -1, prime)
    inv_dens = [0] * k
    for i in range(k - 1, -1, -1):
        inv_dens[i] = inv * prefix[i] % prime
        inv = inv * dens[i] % prime
    return tuple(n * d % prime for n, d in zip(nums, inv_dens, strict=True))


def combine(xs: Sequence[int], ys: Sequence[int], prime: int = PRIME) -> int:
    """f(0) from len(xs) points (x_i, y_i) of a polynomial of degree < len(xs)."""
    coefficients = lagrange_at_zero(tuple(xs), prime)
    return sum(c * y for c, y in zip(coefficients, ys, strict=True)) % prime


def secret_to_int(secret: bytes) -> int:
    if len(secret) != SECRET_BYTES:
        raise ValueError("secrets are 32 bytes")
    return int.from_bytes(secret, "big")


def int_to_secret(value: int) -> bytes:
    """Inverse of secret_to_int; ValueError if value is not a 32-byte secret
    (as happens when reconstruction used a bad share)."""
    if not 0 <= value < 1 << (8 * SECRET_BYTES):
        raise ValueError("not a 32-byte secret")
    return value.to_bytes(SECRET_BYTES, "big")


def element_to_bytes(value: int) -> bytes:
    return value.to_bytes(ELEMENT_BYTES, "big")


def element_from_bytes(data: bytes) -> int:
    return int.from_bytes(data, "big")
