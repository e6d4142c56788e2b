"""Uniform random integers, exactly, from a cryptographically secure source.

Everything random in the exact noise sampler (`dpmech.exact_sampler`) comes
from `uniform_below`, which turns random bytes into integers uniform on
{0, ..., m - 1} by rejection: no floating point, no modulo bias. It reads
words of 1, 2, 4 or 8 bytes, the narrowest with at least 64 values per
residue. The bytes come from a `ByteSource`:

- `SystemBytes` reads the operating system's CSPRNG (`os.urandom`, which is
  `getrandom(2)` on Linux), buffered so that a vectorised pass costs no
  system call of its own. This is what a device uses.
- `GeneratorBytes` reads a seeded numpy `Generator`: reproducible, NOT
  secure; for tests that must replay a draw.
- `XofBytes` expands a secret 32-byte seed with SHAKE-256: reproducible by
  whoever holds the seed, pseudorandom to whoever does not (the noise
  components a server regenerates and removes, `dpmech.removable_noise`).
"""

from __future__ import annotations

import hashlib
import os
from typing import Protocol

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]
Bits = npt.NDArray[np.bool_]

# The largest modulus `uniform_below` accepts: values stay non-negative int64.
MAX_MODULUS = 1 << 62
_LANES: tuple[tuple[int, type[np.unsignedinteger]], ...] = (
    (1 << 8, np.uint8), (1 << 16, np.uint16), (1 << 32, np.uint32))


class ByteSource(Protocol):
    """A supply of independent uniform random bytes."""

    def take(self, n: int) -> U8:
        """`n` fresh uniform bytes (never handed out twice)."""
        ...


class SystemBytes:
    """Uniform bytes from `os.urandom`, read `buffer_bytes` at a time."""

    def __init__(self, buffer_bytes: int = 1 << 20) -> None:
        if buffer_bytes < 1:
            raise ValueError(f"buffer_bytes must be >= 1, got {buffer_bytes}")
        self._size = buffer_bytes
        self._buffer: U8 = np.empty(0, dtype=np.uint8)
        self._next = 0

    def take(self, n: int) -> U8:
        if n < 0:
            raise ValueError(f"cannot take {n} bytes")
        if n > self._size:  # a large request bypasses the buffer
            return np.frombuffer(os.urandom(n), dtype=np.uint8)
        if self._next + n > self._buffer.size:
            self._buffer = np.frombuffer(os.urandom(self._size), dtype=np.uint8)
            self._next = 0
        out = self._buffer[self._next:self._next + n]
        self._next += n
        return out


class GeneratorBytes:
    """Uniform bytes from a seeded numpy Generator (reproducible, not secure)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng

    def take(self, n: int) -> U8:
        return np.frombuffer(self._rng.bytes(n), dtype=np.uint8)


class XofBytes:
    """The stream SHAKE-256(domain || seed || i), i = 0, 1, ... (8-byte
    big-endian block index), each block `BLOCK` bytes: the same seed and
    domain give the same bytes, in the same order, on every machine."""

    BLOCK = 1 << 16
    SEED_BYTES = 32

    def __init__(self, seed: bytes, domain: bytes) -> None:
        if len(seed) != self.SEED_BYTES:
            raise ValueError(f"the seed must be {self.SEED_BYTES} bytes, got {len(seed)}")
        self._prefix = len(domain).to_bytes(2, "big") + domain + seed  # length-prefixed: no domain is another's prefix
        self._block = 0
        self._buffer: U8 = np.empty(0, dtype=np.uint8)
        self._next = 0

    def _refill(self) -> U8:
        data = hashlib.shake_256(self._prefix + self._block.to_bytes(8, "big")).digest(self.BLOCK)
        self._block += 1
        return np.frombuffer(data, dtype=np.uint8)

    def take(self, n: int) -> U8:
        if n < 0:
            raise ValueError(f"cannot take {n} bytes")
        parts: list[U8] = []
        while n > 0:
            if self._next == self._buffer.size:
                self._buffer, self._next = self._refill(), 0
            part = self._buffer[self._next:self._next + n]
            self._next += part.size
            n -= part.size
            parts.append(part)
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.uint8)


def _lane(modulus: int) -> type[np.unsignedinteger]:
    """The narrowest unsigned dtype with at least 64 values per residue of
    `modulus` (a try then fails with probability below 1/64), or uint64."""
    for bound, dtype in _LANES:
        if modulus << 6 <= bound:
            return dtype
    return np.uint64


def uniform_below(modulus: int, n: int, source: ByteSource) -> I64:
    """`n` independent integers uniform on {0, ..., modulus - 1}, 1 <= modulus <= 2^62.

    A try reads one word of the lane's width, W uniform on [0, 2^bits), and
    is kept when W < floor(2^bits / modulus) * modulus; then W mod modulus is
    exactly uniform. Rejected tries are redrawn."""
    if not 1 <= modulus <= MAX_MODULUS:
        raise ValueError(f"modulus must be in [1, 2^62], got {modulus}")
    if modulus == 1:
        return np.zeros(n, dtype=np.int64)
    dtype = _lane(modulus)
    bits = 8 * np.dtype(dtype).itemsize
    limit = dtype(((1 << bits) // modulus) * modulus - 1)  # the largest kept word
    mod = dtype(modulus)
    words = source.take(n * (bits // 8)).view(dtype)
    out: I64 = (words % mod).astype(np.int64)
    pending = np.flatnonzero(words > limit)
    while pending.size:
        words = source.take(pending.size * (bits // 8)).view(dtype)
        ok = words <= limit
        out[pending[ok]] = words[ok] % mod
        pending = pending[~ok]
    return out


def fair_bits(n: int, source: ByteSource) -> Bits:
    """`n` fair bits (one byte's lowest bit each)."""
    return (source.take(n) & np.uint8(1)).astype(np.bool_)
