"""X25519 key agreement and every HKDF-SHA256 derivation of the protocol.

Each device holds two X25519 key pairs per round (Bonawitz et al. Sec. 4):
the c-pair, whose agreement keys the encryption of Shamir shares, and the
s-pair, whose agreement seeds the pairwise masks. They are separate because
the server may reconstruct s_u^SK of a dropped device; that must not open the
share ciphertexts u sent or received.

Every derived key binds (protocol label, purpose, session id, round, ids)
through HKDF's `info`, encoded without ambiguity by `context()`:

    b"fedmask/secagg/v1/" + purpose + 0x00 + len(session) (1 byte) + session
      + round (8 bytes, big endian) + each id (4 bytes, big endian)

- pairwise mask key:  HKDF(X25519(s_u, s_v), info=context("pairwise-mask",
  min(u, v), max(u, v))) -> 16 bytes. Order-independent: both ends derive the
  same key from the symmetric agreement.
- self-mask key:      HKDF(b_u, info=context("self-mask", u)) -> 16 bytes.
- share key u -> v:   HKDF(X25519(c_u, c_v), info=context("share-key", u, v))
  -> 32 bytes (AES-256-GCM). Directional: the key for u -> v differs from the
  key for v -> u, so the two ciphertexts of a pair never share a key.
- graph seed:         HKDF(session id, info=context("graph")) -> 32 bytes.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from secagg.errors import MalformedMessage
from secagg.randomness import RandomSource

PROTOCOL_LABEL = b"fedmask/secagg/v1/"
PUBLIC_KEY_BYTES = 32
PRIVATE_KEY_BYTES = 32
SEED_BYTES = 32
MASK_KEY_BYTES = 16
SHARE_KEY_BYTES = 32


def context(purpose: bytes, session_id: bytes, round_idx: int, *ids: int) -> bytes:
    """The unambiguous binding string used as HKDF info, AEAD associated data
    and signature payload prefix (see module doc)."""
    return _context_prefix(purpose, session_id, round_idx) + struct.pack(f">{len(ids)}I", *ids)


@functools.lru_cache(maxsize=64)
def _context_prefix(purpose: bytes, session_id: bytes, round_idx: int) -> bytes:
    return b"".join(
        (
            PROTOCOL_LABEL,
            purpose,
            b"\x00",
            len(session_id).to_bytes(1, "big"),
            session_id,
            round_idx.to_bytes(8, "big"),
        )
    )


def hkdf_sha256(ikm: bytes, *, info: bytes, length: int, salt: bytes | None = None) -> bytes:
    """RFC 5869 HKDF with SHA-256 (the cryptography implementation)."""
    return HKDF(hashes.SHA256(), length, salt, info).derive(ikm)


@dataclass(frozen=True, slots=True)
class KeyPair:
    """An X25519 key pair; `public` is the 32-byte raw encoding."""

    private: X25519PrivateKey
    public: bytes

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> KeyPair:
        sk = X25519PrivateKey.from_private_bytes(raw)
        return cls(sk, sk.public_key().public_bytes_raw())

    def private_bytes(self) -> bytes:
        return self.private.private_bytes_raw()


def generate_key_pair(rand: RandomSource) -> KeyPair:
    """A fresh X25519 pair from 32 bytes of the injected randomness."""
    return KeyPair.from_private_bytes(rand(PRIVATE_KEY_BYTES))


def agree(private: X25519PrivateKey, peer_public: bytes) -> bytes:
    """The raw X25519 shared secret. A malformed or low-order peer key (which
    would give the all-zero secret) raises MalformedMessage."""
    try:
        return private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError:
        raise MalformedMessage("invalid X25519 public key") from None


def pairwise_mask_key(shared: bytes, *, session_id: bytes, round_idx: int, a: int, b: int) -> bytes:
    """Order-independent mask key of the pair {a, b}."""
    lo, hi = (a, b) if a < b else (b, a)
    return hkdf_sha256(
        shared, info=context(b"pairwise-mask", session_id, round_idx, lo, hi), length=MASK_KEY_BYTES
    )


def self_mask_key(seed: bytes, *, session_id: bytes, round_idx: int, owner: int) -> bytes:
    """Mask key of device `owner`'s self-mask, from its seed b_u."""
    return hkdf_sha256(
        seed, info=context(b"self-mask", session_id, round_idx, owner), length=MASK_KEY_BYTES
    )


def share_key(shared: bytes, *, session_id: bytes, round_idx: int, sender: int, receiver: int) -> bytes:
    """Directional AES-256-GCM key for the shares `sender` encrypts to `receiver`."""
    return hkdf_sha256(
        shared,
        info=context(b"share-key", session_id, round_idx, sender, receiver),
        length=SHARE_KEY_BYTES,
    )


def graph_seed(session_id: bytes, round_idx: int) -> bytes:
    """Public seed of the round's random relabeling of the Harary graph.
    Both ends derive it; nobody picks it after seeing the keys."""
    return hkdf_sha256(session_id, info=context(b"graph", session_id, round_idx), length=32)
