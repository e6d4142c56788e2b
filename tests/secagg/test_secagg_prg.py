"""The mask PRG: AES-128-CTR keystream as little-endian uint32 words."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from secagg.prg import MaskGenerator


def _ecb(key: bytes, block: bytes) -> bytes:
    e = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    return e.update(block) + e.finalize()


def test_ecb_path_matches_fips197() -> None:
    # FIPS-197 Appendix C.1 (AES-128).
    key = bytes(range(16))
    assert _ecb(key, bytes.fromhex("00112233445566778899aabbccddeeff")).hex() == "69c4e0d86a7b0430d8cdb78070b4c55a"


@pytest.mark.parametrize("length", [1, 3, 4, 5, 100, 1031])
def test_known_answer_against_aes_blocks(length: int) -> None:
    key = bytes.fromhex("2b7e151628aed2a6abf7158809cf4f3c")
    nblocks = (4 * length + 15) // 16
    keystream = b"".join(_ecb(key, i.to_bytes(16, "big")) for i in range(nblocks))
    expected = np.frombuffer(keystream[: 4 * length], dtype="<u4")
    got = MaskGenerator(length).expand(key)
    assert got.dtype == np.uint32 and got.shape == (length,)
    np.testing.assert_array_equal(got, expected)


def test_known_answer_against_ctr_directly() -> None:
    key = bytes(range(100, 116))
    e = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
    expected = np.frombuffer(e.update(bytes(4 * 777)), dtype="<u4")
    np.testing.assert_array_equal(MaskGenerator(777).expand(key), expected)


def test_buffer_is_reused() -> None:
    gen = MaskGenerator(64)
    a = gen.expand(b"\x01" * 16)
    first = a.copy()
    b = gen.expand(b"\x02" * 16)
    assert a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
    assert not np.array_equal(first, b)  # a was overwritten in place


def test_add_and_subtract_wrap_mod_2_32() -> None:
    gen = MaskGenerator(1000)
    acc = np.full(1000, 2**32 - 1, dtype=np.uint32)
    gen.add(acc, b"k" * 16)
    mask = gen.expand(b"k" * 16).astype(np.uint64)
    np.testing.assert_array_equal(acc, ((2**32 - 1 + mask) % 2**32).astype(np.uint32))
    gen.subtract(acc, b"k" * 16)
    assert (acc == 2**32 - 1).all()


def test_rejects_bad_keys_and_lengths() -> None:
    with pytest.raises(ValueError):
        MaskGenerator(0)
    with pytest.raises(ValueError):
        MaskGenerator(4).expand(b"short")
