"""The mask PRG: AES-128-CTR keystream read as little-endian uint32 words.

Contract: PRG(key)[i] = little-endian uint32 at bytes 4i..4i+3 of the
AES-128-CTR keystream of `key` with an all-zero initial counter block (the
keystream is AES_k(0), AES_k(1), ... with the 128-bit big-endian counter).
Every key is a fresh 16-byte HKDF output bound to session, round, purpose and
ids (keys.py), so one key never meets two counters ranges.

`MaskGenerator` owns one output buffer and reuses it for every expansion;
`add`/`subtract` fold a mask into an accumulator in place (uint32 wraparound).
"""

from __future__ import annotations

import functools

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

KEY_BYTES = 16
_ZERO_COUNTER = bytes(16)
_BLOCK = 16


@functools.lru_cache(maxsize=4)
def _zeros(nbytes: int) -> bytes:
    # The plaintext of "encrypt zeros"; immutable, so shared by every generator.
    return bytes(nbytes)


class MaskGenerator:
    """Expands 16-byte keys into `length` uint32 words, into one reused buffer."""

    __slots__ = ("length", "_buf", "_view", "_zeros")

    def __init__(self, length: int) -> None:
        if not (isinstance(length, int) and length >= 1):
            raise ValueError(f"length must be a positive int, got {length!r}")
        self.length = length
        nbytes = 4 * length
        self._zeros = _zeros(nbytes)
        # update_into wants room for one extra block minus one byte.
        self._buf = bytearray(nbytes + _BLOCK - 1)
        self._view = np.frombuffer(self._buf, dtype="<u4", count=length)

    def expand(self, key: bytes) -> np.ndarray:
        """PRG(key) as a read-only-by-convention view of the internal buffer:
        valid until the next call on this generator; copy it to keep it."""
        if len(key) != KEY_BYTES:
            raise ValueError("mask keys are 16 bytes")
        enc = Cipher(algorithms.AES(key), modes.CTR(_ZERO_COUNTER)).encryptor()
        enc.update_into(self._zeros, self._buf)
        return self._view

    def add(self, acc: np.ndarray, key: bytes) -> None:
        """acc += PRG(key) (mod 2^32), in place."""
        np.add(acc, self.expand(key), out=acc)

    def subtract(self, acc: np.ndarray, key: bytes) -> None:
        """acc -= PRG(key) (mod 2^32), in place."""
        np.subtract(acc, self.expand(key), out=acc)
