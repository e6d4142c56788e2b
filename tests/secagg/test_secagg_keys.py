"""Key agreement and HKDF derivations: RFC vectors and independent recomputation."""

from __future__ import annotations

import hashlib
import hmac
import struct
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from secagg import keys
from secagg.errors import MalformedMessage


def _hkdf_reference(ikm: bytes, salt: bytes | None, info: bytes, length: int) -> bytes:
    """RFC 5869 with the standard library, independent of cryptography."""
    prk = hmac.new(salt or bytes(32), ikm, hashlib.sha256).digest()
    out, block, i = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        out += block
        i += 1
    return out[:length]


def test_hkdf_rfc5869_case_1() -> None:
    okm = keys.hkdf_sha256(
        bytes([0x0B] * 22), salt=bytes(range(13)), info=bytes(range(0xF0, 0xFA)), length=42
    )
    assert okm.hex() == (
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
    )


def test_x25519_rfc7748_vector() -> None:
    alice = keys.KeyPair.from_private_bytes(
        bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
    )
    bob = keys.KeyPair.from_private_bytes(
        bytes.fromhex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb")
    )
    assert alice.public.hex() == "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
    assert bob.public.hex() == "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f"
    shared = "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742"
    assert keys.agree(alice.private, bob.public).hex() == shared
    assert keys.agree(bob.private, alice.public).hex() == shared


def _info(purpose: bytes, session: bytes, round_idx: int, *ids: int) -> bytes:
    return (
        b"fedmask/secagg/v1/" + purpose + b"\x00" + bytes([len(session)]) + session
        + struct.pack(">Q", round_idx) + b"".join(struct.pack(">I", i) for i in ids)
    )


def test_derivations_match_the_documented_binding() -> None:
    shared = bytes(range(32))
    sid = b"session-A"
    assert keys.pairwise_mask_key(shared, session_id=sid, round_idx=7, a=9, b=4) == _hkdf_reference(
        shared, None, _info(b"pairwise-mask", sid, 7, 4, 9), 16
    )
    assert keys.self_mask_key(shared, session_id=sid, round_idx=7, owner=3) == _hkdf_reference(
        shared, None, _info(b"self-mask", sid, 7, 3), 16
    )
    assert keys.share_key(shared, session_id=sid, round_idx=7, sender=1, receiver=2) == _hkdf_reference(
        shared, None, _info(b"share-key", sid, 7, 1, 2), 32
    )
    assert keys.graph_seed(sid, 7) == _hkdf_reference(sid, None, _info(b"graph", sid, 7), 32)


def test_pairwise_key_is_order_independent_share_key_directional() -> None:
    a = keys.KeyPair.from_private_bytes(b"\x11" * 32)
    b = keys.KeyPair.from_private_bytes(b"\x22" * 32)
    s_ab = keys.agree(a.private, b.public)
    s_ba = keys.agree(b.private, a.public)
    assert s_ab == s_ba
    kw: dict[str, Any] = {"session_id": b"s", "round_idx": 1}
    assert keys.pairwise_mask_key(s_ab, a=1, b=2, **kw) == keys.pairwise_mask_key(s_ba, a=2, b=1, **kw)
    assert keys.share_key(s_ab, sender=1, receiver=2, **kw) != keys.share_key(s_ab, sender=2, receiver=1, **kw)


def test_every_binding_changes_the_key() -> None:
    shared = b"\x33" * 32
    base = keys.pairwise_mask_key(shared, session_id=b"s", round_idx=1, a=1, b=2)
    assert keys.pairwise_mask_key(shared, session_id=b"t", round_idx=1, a=1, b=2) != base
    assert keys.pairwise_mask_key(shared, session_id=b"s", round_idx=2, a=1, b=2) != base
    assert keys.pairwise_mask_key(shared, session_id=b"s", round_idx=1, a=1, b=3) != base
    assert keys.self_mask_key(shared, session_id=b"s", round_idx=1, owner=1) != keys.self_mask_key(
        shared, session_id=b"s", round_idx=1, owner=2
    )


def test_generate_uses_the_injected_randomness() -> None:
    pair = keys.generate_key_pair(lambda n: b"\x07" * n)
    assert pair.private_bytes() == b"\x07" * 32
    assert pair.public == X25519PrivateKey.from_private_bytes(b"\x07" * 32).public_key().public_bytes_raw()


@pytest.mark.parametrize("bad", [bytes(32), b"\x01" + bytes(31), b"short"])
def test_low_order_or_malformed_peer_keys_are_refused(bad: bytes) -> None:
    with pytest.raises(MalformedMessage):
        keys.agree(X25519PrivateKey.from_private_bytes(b"\x05" * 32), bad)
