"""AES-GCM for the Shamir shares a device sends to a peer.

Sealed blob = nonce (12 bytes, from the injected randomness) || ciphertext ||
tag (16 bytes). The key is the directional share key of keys.py; the
associated data `share_associated_data(session, round, sender, receiver)`
binds the same ids again, so a blob relayed to the wrong device, another
round or another session fails authentication.

`open_sealed` turns every failure into the one opaque `DecryptionError`.
"""

from __future__ import annotations

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from secagg.errors import DecryptionError
from secagg.keys import context
from secagg.randomness import RandomSource

NONCE_BYTES = 12
TAG_BYTES = 16


def share_associated_data(session_id: bytes, round_idx: int, sender: int, receiver: int) -> bytes:
    return context(b"share-ad", session_id, round_idx, sender, receiver)


def seal(key: bytes, plaintext: bytes, associated_data: bytes, rand: RandomSource) -> bytes:
    """nonce || AES-GCM(key, nonce, plaintext, associated_data)."""
    nonce = rand(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, associated_data)


def sealed_length(plaintext_length: int) -> int:
    return NONCE_BYTES + plaintext_length + TAG_BYTES


def open_sealed(key: bytes, sealed: bytes, associated_data: bytes) -> bytes:
    """The plaintext, or DecryptionError (no detail) for any failure."""
    try:
        if len(sealed) < NONCE_BYTES + TAG_BYTES:
            raise ValueError
        return AESGCM(key).decrypt(bytes(sealed[:NONCE_BYTES]), bytes(sealed[NONCE_BYTES:]), associated_data)
    except Exception:
        raise DecryptionError() from None
