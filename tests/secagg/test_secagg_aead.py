"""AES-GCM share encryption: one opaque error for every failure."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from secagg.aead import NONCE_BYTES, open_sealed, seal, sealed_length, share_associated_data
from secagg.errors import DecryptionError

KEY = bytes(range(32))
AD = share_associated_data(b"session", 3, 1, 2)


def _fixed(n: int) -> bytes:
    return b"\x09" * n


def test_known_answer_against_aesgcm_directly() -> None:
    sealed = seal(KEY, b"x" * 66, AD, _fixed)
    assert sealed[:NONCE_BYTES] == b"\x09" * 12
    assert sealed[NONCE_BYTES:] == AESGCM(KEY).encrypt(b"\x09" * 12, b"x" * 66, AD)
    assert len(sealed) == sealed_length(66) == 94
    assert open_sealed(KEY, sealed, AD) == b"x" * 66


def _assert_opaque(exc: pytest.ExceptionInfo) -> None:
    assert exc.value.args == ()
    assert str(exc.value) == ""
    assert exc.value.__cause__ is None and exc.value.__suppress_context__


def test_tampered_ciphertext() -> None:
    sealed = bytearray(seal(KEY, b"y" * 66, AD, _fixed))
    for pos in (0, NONCE_BYTES, len(sealed) - 1):
        bad = bytearray(sealed)
        bad[pos] ^= 1
        with pytest.raises(DecryptionError) as exc:
            open_sealed(KEY, bytes(bad), AD)
        _assert_opaque(exc)


def test_wrong_associated_data_round_session_or_ids() -> None:
    sealed = seal(KEY, b"z" * 66, AD, _fixed)
    for other in (
        share_associated_data(b"session", 4, 1, 2),
        share_associated_data(b"other", 3, 1, 2),
        share_associated_data(b"session", 3, 2, 1),
        share_associated_data(b"session", 3, 1, 3),
    ):
        with pytest.raises(DecryptionError) as exc:
            open_sealed(KEY, sealed, other)
        _assert_opaque(exc)


def test_wrong_key_truncated_and_garbage() -> None:
    sealed = seal(KEY, b"w" * 66, AD, _fixed)
    for key, blob in ((b"\x00" * 32, sealed), (KEY, sealed[:20]), (KEY, b""), (b"short", sealed)):
        with pytest.raises(DecryptionError) as exc:
            open_sealed(key, blob, AD)
        _assert_opaque(exc)
