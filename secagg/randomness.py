"""Injected randomness (the pyca style: the innermost function takes it).

A `RandomSource` is any callable `rand(n) -> n bytes`. Production code passes
`os.urandom` (the default everywhere); known-answer tests and reproducible
simulations pass a `DeterministicRandom`.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

RandomSource = Callable[[int], bytes]

system_random: RandomSource = os.urandom


class DeterministicRandom:
    """A reproducible byte stream: AES-256-CTR keyed by HKDF(seed, label).

    For tests and simulations only; its output is as unpredictable as the
    seed, which is typically public in those settings.
    """

    __slots__ = ("_enc",)

    def __init__(self, seed: bytes | int, label: bytes | str = b"") -> None:
        if isinstance(seed, int):
            seed = seed.to_bytes(16, "big", signed=True)
        if isinstance(label, str):
            label = label.encode()
        key = HKDF(hashes.SHA256(), 32, None, b"fedmask/secagg/v1/deterministic-random\x00" + label).derive(
            bytes(seed)
        )
        self._enc = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()

    def __call__(self, n: int) -> bytes:
        return self._enc.update(bytes(n))
