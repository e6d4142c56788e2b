"""Shamir sharing: a hand-checked tiny field, the real prime, reconstruction."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

import pytest

from secagg import shamir


def _coefficient_source(values: list[int], prime: int) -> Callable[[int], bytes]:
    """A fake RandomSource that makes random_element return `values` in order."""
    nbytes = (prime.bit_length() + 7) // 8 + 16
    stream = iter(values)

    def source(n: int) -> bytes:
        assert n == nbytes
        return next(stream).to_bytes(n, "big")

    return source


def test_hand_checked_example_mod_17() -> None:
    # f(x) = 13 + 10x + 2x^2 mod 17:
    # f(1)=25=8, f(2)=41=7, f(3)=61=10, f(4)=85=0, f(5)=113=11 (mod 17).
    shares = shamir.split([13], [1, 2, 3, 4, 5], 3, _coefficient_source([10, 2], 17), prime=17)
    assert shares == [[8, 7, 10, 0, 11]]
    # Lagrange at 0 for x = 1, 2, 3: 3, -3 (=14), 1; 3*8 - 3*7 + 10 = 13.
    assert shamir.lagrange_at_zero((1, 2, 3), 17) == (3, 14, 1)
    for xs in itertools.combinations(range(1, 6), 3):
        assert shamir.combine(xs, [shares[0][x - 1] for x in xs], prime=17) == 13
    # Two shares are not enough: the line through (1, 8), (2, 7) meets 0 at 9.
    assert shamir.combine((1, 2), [8, 7], prime=17) == 9


def test_fewer_than_t_shares_are_consistent_with_every_secret() -> None:
    # t = 2 over GF(17): for any single share (x, y) and any candidate secret s
    # there is exactly one slope a with s + a x = y.
    for x in range(1, 17):
        for y in range(17):
            slopes = {s: [a for a in range(17) if (s + a * x) % 17 == y] for s in range(17)}
            assert all(len(v) == 1 for v in slopes.values())


def _miller_rabin(n: int, bases: list[int]) -> bool:
    d, r = n - 1, 0
    while d % 2 == 0:
        d //= 2
        r += 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = pow(x, 2, n)
            if x == n - 1:
                break
        else:
            return False
    return True


def test_the_field_prime() -> None:
    p = shamir.PRIME
    assert p == 2**256 + 297
    bases = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37] + random.Random(0).sample(range(41, 10**6), 40)
    assert _miller_rabin(p, bases)
    # The smallest prime above 2^256: every odd number in between is composite.
    assert not any(_miller_rabin(c, bases[:12]) for c in range(2**256 + 1, p, 2))
    # Every 32-byte secret is a field element; shares take 33 bytes.
    assert 2**256 - 1 < p < 2 ** (8 * shamir.ELEMENT_BYTES)


def test_real_field_roundtrip_any_t_subset() -> None:
    rng = random.Random(5)
    rand = lambda n: rng.randbytes(n)  # noqa: E731
    secrets = [2**256 - 1, 0, int.from_bytes(rng.randbytes(32), "big")]
    xs = [shamir.x_of(i) for i in range(9)]
    shares = shamir.split(secrets, xs, 5, rand)
    for subset in (range(5), range(4, 9), (0, 2, 4, 6, 8)):
        sx = tuple(xs[i] for i in subset)
        for j, s in enumerate(secrets):
            assert shamir.combine(sx, [shares[j][i] for i in subset]) == s


def test_lagrange_matches_naive_inverses() -> None:
    p = shamir.PRIME
    xs = (3, 8, 11, 40, 77)
    naive = []
    for i, xi in enumerate(xs):
        num = den = 1
        for j, xj in enumerate(xs):
            if i != j:
                num = num * xj % p
                den = den * (xj - xi) % p
        naive.append(num * pow(den, p - 2, p) % p)
    assert shamir.lagrange_at_zero(xs) == tuple(naive)


def test_lagrange_coefficients_are_cached_per_x_set() -> None:
    shamir.lagrange_at_zero.cache_clear()
    for _ in range(10):
        shamir.combine((1, 2, 3), [1, 2, 3])
    info = shamir.lagrange_at_zero.cache_info()
    assert info.misses == 1 and info.hits == 9


def test_secret_encoding() -> None:
    assert shamir.int_to_secret(shamir.secret_to_int(b"\xff" * 32)) == b"\xff" * 32
    with pytest.raises(ValueError):
        shamir.int_to_secret(2**256)
    with pytest.raises(ValueError):
        shamir.secret_to_int(b"x" * 31)


@pytest.mark.parametrize(
    "secrets,xs,t",
    [([1], [1, 2], 3), ([1], [1, 1, 2], 2), ([1], [0, 1], 1), ([shamir.PRIME], [1, 2], 1), ([1], [1, 2], 0)],
)
def test_split_misuse(secrets, xs, t) -> None:
    with pytest.raises(ValueError):
        shamir.split(secrets, xs, t, lambda n: bytes(n))
