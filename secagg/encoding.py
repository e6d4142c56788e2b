"""Clipping and fixed-point encoding of float updates into Z_{2^32}.

Contract
--------
A device's float vector x is clipped to [-c, c] and mapped to integers

    q = round((clip(x, -c, c) + c) * scale)  in  [0, max_level]

with `max_level = floor((2^w - 1) / n)` and `scale = max_level / (2c)`. So the
sum of any n encoded vectors is at most n * max_level <= 2^w - 1: it can never
wrap, and the protocol's modular sum is the exact integer sum. `w` (the
modulus bits) is at most 32; encoded vectors are np.uint32 and all masking
arithmetic is uint32 wraparound (mod 2^32, of which 2^w is a divisor, so an
exact sum below 2^w is recovered bit for bit).

One encoding per round: when a round runs in groups (D87), every group's
instance uses the cohort's encoding (`for_group`: the cohort's max_level
for fewer devices), so any partial sum stays below 2^w and the groups'
sums add exactly.

Rounding is stochastic (unbiased: floor(v + u), u ~ U[0, 1)) when a numpy
Generator is passed, deterministic (round half up) otherwise. That generator
is only for rounding; masks never use numpy's RNG (see prg.py).

Decoding the sum of m encoded vectors: (sum mod 2^w) / scale - m * c; the
mean divides that by m (the number of counted devices). The reduction mod 2^w
is the protocol's own ring: the secagg server unmasks mod 2^32, and since 2^w
divides 2^32 the word it returns is congruent to the exact sum mod 2^w. An
honest sum is below 2^w, so the reduction leaves it as it is, bit for bit;
a device that puts an arbitrary uint32 in its masked input (D86) can then
put the decoded sum no further than (2^w - 1) / scale - m * c, the same reach
relative to the clip whatever w is (without it, 2^(32 - w) times further).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from secagg.errors import SecAggConfigError, EncodingRangeError

MAX_MODULUS_BITS = 32


@dataclass(frozen=True, slots=True)
class FixedPointEncoding:
    """Fixed point for a cohort of `num_clients` devices (see module doc)."""

    clip: float
    num_clients: int
    modulus_bits: int
    max_level: int  # largest encoded value of one coordinate of one device

    def __post_init__(self) -> None:
        if not (isinstance(self.clip, float | int) and math.isfinite(self.clip) and self.clip > 0):
            raise SecAggConfigError(f"clip must be a positive finite number, got {self.clip!r}")
        if not (isinstance(self.num_clients, int) and self.num_clients >= 1):
            raise SecAggConfigError(f"num_clients must be a positive int, got {self.num_clients!r}")
        if not (isinstance(self.modulus_bits, int) and 1 <= self.modulus_bits):
            raise SecAggConfigError(f"modulus_bits must be a positive int, got {self.modulus_bits!r}")
        if self.modulus_bits > MAX_MODULUS_BITS:
            raise EncodingRangeError(
                f"modulus_bits={self.modulus_bits} > {MAX_MODULUS_BITS}: vectors are uint32"
            )
        if not (isinstance(self.max_level, int) and self.max_level >= 1):
            raise EncodingRangeError(
                f"max_level={self.max_level!r}: {self.num_clients} inputs leave no room in "
                f"{self.modulus_bits} bits"
            )
        if self.num_clients * self.max_level >= 1 << self.modulus_bits:
            raise EncodingRangeError(
                f"the sum of {self.num_clients} inputs of up to {self.max_level} could wrap "
                f"2^{self.modulus_bits}"
            )

    @classmethod
    def for_cohort(
        cls,
        num_clients: int,
        *,
        clip: float,
        modulus_bits: int | None = None,
        precision: float | None = None,
    ) -> FixedPointEncoding:
        """Pick w and the scale so that n * (2c * scale) < 2^w.

        - `precision` (a quantization step, e.g. 1e-6): the scale is at least
          1/precision, and w is the fewest bits that hold n such values; if
          that is more than 32 (or than `modulus_bits`, when also given) the
          configuration is refused with `EncodingRangeError`.
        - only `modulus_bits`: the finest scale that fits in w bits.
        - neither: w = 32.
        """
        if not (isinstance(num_clients, int) and num_clients >= 1):
            raise SecAggConfigError(f"num_clients must be a positive int, got {num_clients!r}")
        if not (math.isfinite(clip) and clip > 0):
            raise SecAggConfigError(f"clip must be a positive finite number, got {clip!r}")
        if precision is not None:
            if not (math.isfinite(precision) and precision > 0):
                raise SecAggConfigError(f"precision must be a positive number, got {precision!r}")
            level = math.ceil(2 * clip / precision)
            bits = (num_clients * level).bit_length()  # n * level < 2^bits
            limit = MAX_MODULUS_BITS if modulus_bits is None else modulus_bits
            if bits > limit:
                raise EncodingRangeError(
                    f"{num_clients} inputs in [-{clip}, {clip}] at step {precision} need "
                    f"{bits} bits (> {limit})"
                )
            w = bits if modulus_bits is None else modulus_bits
        else:
            w = MAX_MODULUS_BITS if modulus_bits is None else modulus_bits
        return cls(float(clip), num_clients, w, ((1 << w) - 1) // num_clients)

    def for_group(self, num_clients: int) -> FixedPointEncoding:
        """This encoding for an instance that sums at most `num_clients` of
        its inputs (a group of the cohort it is sized for; D87): the same
        clip, w and max_level, hence the same encoded values and scale, so
        the groups' sums add into the cohort's without overflow."""
        if isinstance(num_clients, bool) or not (isinstance(num_clients, int) and 1 <= num_clients <= self.num_clients):
            raise SecAggConfigError(f"a group of this encoding has 1..{self.num_clients} devices, got {num_clients!r}")
        return FixedPointEncoding(self.clip, num_clients, self.modulus_bits, self.max_level)

    @property
    def scale(self) -> float:
        """Encoded units per unit of the input."""
        return self.max_level / (2.0 * self.clip)

    @property
    def step(self) -> float:
        """The quantization step (1 / scale)."""
        return (2.0 * self.clip) / self.max_level

    def encode(self, x: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        """Clip and encode a 1-D float vector; returns a new np.uint32 vector.

        NaN is refused (ValueError); +-inf clip to +-c.
        """
        x = np.asarray(x)
        if x.ndim != 1 or not np.issubdtype(x.dtype, np.floating):
            raise TypeError(f"expected a 1-D float vector, got {x.dtype} of shape {x.shape}")
        if np.isnan(x).any():
            raise ValueError("cannot encode NaN")
        v = np.clip(x, -self.clip, self.clip, dtype=np.float64)
        v += self.clip
        v *= self.scale
        if rng is None:
            v += 0.5
        else:
            v += rng.random(v.shape[0])
        np.floor(v, out=v)
        np.minimum(v, self.max_level, out=v)  # guards float rounding at the top end
        out: np.ndarray = v.astype(np.uint32)
        return out

    def reduce(self, encoded_sum: np.ndarray) -> np.ndarray:
        """An unmasked sum (uint32 words, mod 2^32) as an element of Z_{2^w}:
        a new np.uint32 vector of its words mod 2^w (see the module doc). The
        identity on an honest sum (below 2^w)."""
        s = np.asarray(encoded_sum)
        if s.dtype != np.uint32:
            raise TypeError(f"encoded sum must be uint32, got {s.dtype}")
        out: np.ndarray = s & np.uint32((1 << self.modulus_bits) - 1)
        return out

    def decode_sum(self, encoded_sum: np.ndarray, count: int) -> np.ndarray:
        """Float sum of `count` clipped inputs from the exact encoded sum
        (reduced mod 2^w first, see the module doc)."""
        if not (isinstance(count, int) and 0 < count <= self.num_clients):
            raise ValueError(f"count must be in 1..{self.num_clients}, got {count!r}")
        return self.reduce(encoded_sum).astype(np.float64) / self.scale - count * self.clip

    def decode_mean(self, encoded_sum: np.ndarray, count: int) -> np.ndarray:
        """Float mean of `count` clipped inputs from the exact encoded sum."""
        return self.decode_sum(encoded_sum, count) / count
