"""Exact sums of bounded non-negative integers as extra coordinates of the
masked vector, apart from the model's fixed-point encoding.

Contract
--------
The round's `FixedPointEncoding` (n devices, modulus 2^w) leaves
`max_level = floor((2^w - 1) / n)` per device and coordinate. A *limb* here
holds b = floor(log2(max_level + 1)) bits, so n limbs of at most 2^b - 1
sum to at most n * (2^b - 1) <= 2^w - 1 < 2^32: no sum of limbs over any
subset of the cohort wraps, and the protocol's modular sum of a limb
coordinate is its exact integer sum. (w = 32: b = 31 for n = 2, 22 for
n = 1,000, 15 for n = 100,000.)

A value v in [0, bound] takes `limbs(bound) = ceil(bitlen(bound) / b)`
coordinates, least significant first: v = sum_j limb_j * 2^(b j). The sum
over m <= n devices of each limb coordinate is S_j <= m (2^b - 1), and the
total sum_j S_j 2^(b j) is the exact integer sum of the m values (Python
ints, any size).

A hostile device can put any uint32 in its limbs. `decode` then refuses a
limb sum above m (2^b - 1) or a total above m * bound (`IntegerRangeError`);
values that wrap back into range cannot be told from honest ones. Either
way only these coordinates are affected: the masked sum is coordinatewise,
so no value here changes any other coordinate of the vector.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from secagg.encoding import FixedPointEncoding
from secagg.errors import EncodingRangeError


class IntegerRangeError(ValueError):
    """A decoded limb sum or total is larger than the counted devices can
    have put there: some device's limbs were out of range."""


@dataclass(frozen=True, slots=True)
class IntegerSumEncoding:
    """Limbs of `limb_bits` bits (see the module doc)."""

    limb_bits: int

    def __post_init__(self) -> None:
        if not (isinstance(self.limb_bits, int) and 1 <= self.limb_bits <= 31):
            raise EncodingRangeError(f"limb_bits must be in 1..31, got {self.limb_bits!r}")

    @classmethod
    def for_encoding(cls, encoding: FixedPointEncoding) -> IntegerSumEncoding:
        """The limb width the round's encoding leaves for n devices."""
        return cls((encoding.max_level + 1).bit_length() - 1)

    @property
    def limb_max(self) -> int:
        return (1 << self.limb_bits) - 1

    def limbs(self, bound: int) -> int:
        """Coordinates a value in [0, bound] takes (at least 1)."""
        if not (isinstance(bound, int) and bound >= 1):
            raise ValueError(f"bound must be a positive int, got {bound!r}")
        return -(-bound.bit_length() // self.limb_bits)

    def encode(self, values: Sequence[int], bounds: Sequence[int]) -> np.ndarray:
        """One device's values (each in [0, its bound]) as uint32 limbs, the
        slots one after another. ValueError for a value out of its range."""
        if len(values) != len(bounds):
            raise ValueError(f"{len(values)} values for {len(bounds)} bounds")
        out: list[int] = []
        for v, bound in zip(values, bounds, strict=True):
            if not (isinstance(v, int) and 0 <= v <= bound):
                raise ValueError(f"value {v!r} is outside [0, {bound}]")
            for _ in range(self.limbs(bound)):
                out.append(v & self.limb_max)
                v >>= self.limb_bits
        return np.asarray(out, dtype=np.uint32)

    def coordinates(self, bounds: Sequence[int]) -> int:
        return sum(self.limbs(b) for b in bounds)

    def decode(self, sums: np.ndarray, bounds: Sequence[int], count: int) -> list[int]:
        """The exact totals of `count` devices' values from the sums of their
        limbs (uint32, `coordinates(bounds)` long). IntegerRangeError when a
        limb sum or total exceeds what `count` honest devices can give."""
        s = np.asarray(sums)
        if s.dtype != np.uint32 or s.shape != (self.coordinates(bounds),):
            raise ValueError(f"expected uint32 limb sums of length {self.coordinates(bounds)}, got {s.dtype} {s.shape}")
        if not (isinstance(count, int) and count >= 0):
            raise ValueError(f"count must be a non-negative int, got {count!r}")
        totals: list[int] = []
        i = 0
        for slot, bound in enumerate(bounds):
            total = 0
            for j in range(self.limbs(bound)):
                limb = int(s[i])
                i += 1
                if limb > count * self.limb_max:
                    raise IntegerRangeError(f"slot {slot}: limb {j} sums to {limb} > {count} x {self.limb_max}")
                total += limb << (self.limb_bits * j)
            if total > count * bound:
                raise IntegerRangeError(f"slot {slot}: total {total} > {count} x {bound}")
            totals.append(total)
        return totals


__all__ = ["IntegerRangeError", "IntegerSumEncoding"]
