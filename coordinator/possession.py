"""Proof of possession of device identity keys (fedmask.v1.1, D32): the
coordinator's checks. Pure apart from the injected clock and randomness.

- `EnrollChallenges`: stateless enrolment challenges. A challenge is
  version || expiry (u64 ms of the injected monotonic clock) || 16 random
  bytes || HMAC-SHA256(secret, the rest)[:16]; the secret is drawn once per
  coordinator process, so a challenge is accepted only by the process that
  issued it and only until it expires (a restart invalidates them: clients
  ask again). Nothing is stored per challenge; a challenge may be used more
  than once while it is valid (each use still needs every device's own
  signature over it, so only the key holder can use it for its key).
- `enrollment_refusal`: the index of the first device of an EnrollRequest
  whose possession signature does not verify.
- `proven_devices`: which announced devices proved possession on a stream.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable, Mapping

from cryptography.hazmat.primitives import constant_time, hashes, hmac

from fedmask_proto.v1 import enrollment_pb2, session_pb2
from secagg.identity import verify
from wire.possession import MAX_CHALLENGE_BYTES, enrollment_payload, session_payload

CHALLENGE_VERSION = 1
CHALLENGE_RANDOM_BYTES = 16
CHALLENGE_MAC_BYTES = 16
CHALLENGE_BYTES = 1 + 8 + CHALLENGE_RANDOM_BYTES + CHALLENGE_MAC_BYTES
#: How long an enrolment challenge is accepted.
DEFAULT_CHALLENGE_TTL_S = 120.0


class EnrollChallenges:
    """Issues and checks enrolment challenges (see the module doc)."""

    def __init__(self, *, clock: Callable[[], float], ttl_s: float = DEFAULT_CHALLENGE_TTL_S,
                 random_bytes: Callable[[int], bytes] = os.urandom) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        self._clock = clock
        self.ttl_s = ttl_s
        self._random = random_bytes
        self._secret = random_bytes(32)

    def _mac(self, body: bytes) -> bytes:
        h = hmac.HMAC(self._secret, hashes.SHA256())
        h.update(body)
        return h.finalize()[:CHALLENGE_MAC_BYTES]

    def issue(self) -> bytes:
        expires_ms = int((self._clock() + self.ttl_s) * 1000)
        body = bytes([CHALLENGE_VERSION]) + struct.pack(">Q", max(0, expires_ms)) + self._random(CHALLENGE_RANDOM_BYTES)
        return body + self._mac(body)

    def refusal(self, challenge: bytes) -> str | None:
        """None when `challenge` was issued by this object and has not
        expired; otherwise why not (safe to send back)."""
        if not challenge:
            return "the EnrollRequest carries no challenge: this coordinator needs fedmask.v1.1 (upgrade the edge client)"
        if len(challenge) != CHALLENGE_BYTES or challenge[0] != CHALLENGE_VERSION:
            return "the enrolment challenge was not issued by this coordinator; ask for a new one"
        body, mac = challenge[:-CHALLENGE_MAC_BYTES], challenge[-CHALLENGE_MAC_BYTES:]
        if not constant_time.bytes_eq(mac, self._mac(body)):
            return "the enrolment challenge was not issued by this coordinator; ask for a new one"
        (expires_ms,) = struct.unpack(">Q", body[1:9])
        if self._clock() * 1000 > expires_ms:
            return "the enrolment challenge expired; ask for a new one"
        return None


def enrollment_refusal(request: enrollment_pb2.EnrollRequest) -> int | None:
    """The index of the first device whose possession_signature does not
    verify under its own identity_public_key over
    `wire.possession.enrollment_payload` (None when every one does). The
    request's shape (key sizes, challenge) is checked before this."""
    challenge = bytes(request.challenge)[:MAX_CHALLENGE_BYTES]
    for i, d in enumerate(request.devices):
        key = bytes(d.identity_public_key)
        payload = enrollment_payload(challenge, request.client_name, d.local_id, key)
        if not verify(key, bytes(d.possession_signature), payload):
            return i
    return None


def proven_devices(nonce: bytes, proofs: Iterable[session_pb2.DeviceProof], wanted: Iterable[int],
                   identity_keys: Mapping[int, bytes]) -> set[int]:
    """The devices of `wanted` that have a proof in `proofs` whose signature
    verifies under their enrolled key (`identity_keys`, device id -> raw
    Ed25519 key) over `wire.possession.session_payload(nonce, id)`. Proofs
    for other ids, and a second proof for one id, are ignored."""
    want = set(wanted)
    proven: set[int] = set()
    seen: set[int] = set()
    for p in proofs:
        d = int(p.device_id)
        if d not in want or d in seen:
            continue
        seen.add(d)
        if verify(identity_keys.get(d), bytes(p.signature), session_payload(nonce, d)):
            proven.add(d)
    return proven


__all__ = [
    "CHALLENGE_BYTES",
    "DEFAULT_CHALLENGE_TTL_S",
    "EnrollChallenges",
    "enrollment_refusal",
    "proven_devices",
]
