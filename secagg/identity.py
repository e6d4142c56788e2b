"""Ed25519 identity signatures for active-adversary mode.

Identity keys come from enrollment (outside this package): each device holds
its Ed25519 private key, and devices and server know every cohort member's
public key. Two payloads are signed, both bound by keys.context():

- advertise:   context("advertise", session, round, device) || c_pk || s_pk
- consistency: context("consistency", session, round, |U3|, *sorted(U3))
"""

from __future__ import annotations

from collections.abc import Iterable

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from secagg.keys import context
from secagg.randomness import RandomSource

SIGNATURE_BYTES = 64
IDENTITY_PUBLIC_BYTES = 32


def generate_identity(rand: RandomSource) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(rand(32))


def public_bytes(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes_raw()


def advertise_payload(session_id: bytes, round_idx: int, device_id: int, c_public: bytes, s_public: bytes) -> bytes:
    return context(b"advertise", session_id, round_idx, device_id) + c_public + s_public


def consistency_payload(session_id: bytes, round_idx: int, alive: Iterable[int]) -> bytes:
    ids = sorted(alive)
    return context(b"consistency", session_id, round_idx, len(ids), *ids)


def sign(key: Ed25519PrivateKey, payload: bytes) -> bytes:
    return key.sign(payload)


def verify(public: bytes | None, signature: bytes, payload: bytes) -> bool:
    """True iff `signature` is valid for `payload` under the raw public key."""
    if public is None or not isinstance(signature, bytes) or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, payload)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True
