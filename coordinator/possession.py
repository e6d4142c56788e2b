"""Proof of possession of device identity keys (fedmask.v1.1, D32): the
coordinator's checks. Pure apart from the injected clock and randomness.

- `EnrollChallenges`: stateless enrolment challenges. A challenge is
  version || expiry (u64 ms) || 16 random bytes || HMAC-SHA256(key, the
  rest)[:16], the key derived from a secret (HMAC-SHA256(secret, a purpose
  label), so the secret may serve other purposes too). Two modes:
    * process (version 1, the default): the secret is drawn once per
      object, the expiry is read on the injected monotonic clock, so a
      challenge is accepted only by the process that issued it and only
      until it expires (a restart invalidates them: clients ask again).
    * tier (version 2, `tier_secret` given: Store.tier_secret, D109): every
      replica of the tier holds the same secret, the expiry is epoch time
      on the injected WALL clock, so any replica accepts a challenge
      another issued. Replicas' clocks may disagree by up to `skew_s`
      (DEFAULT_CLOCK_SKEW_S): a challenge issued at t (issuer's clock) is
      accepted while the verifier's clock reads within [t - skew_s,
      t + ttl_s + skew_s]; an expiry further ahead than ttl_s + skew_s is
      refused (the issuer's clock ran ahead).
  A challenge of one mode is refused by the other (the version is MACed),
  as is one under another secret, a tampered one and an expired one.
  Nothing is stored per challenge; a challenge may be used more than once
  while it is valid (each use still needs every device's own signature
  over it, so only the key holder can use it for its key).
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

#: Version byte of a process challenge (expiry on the issuer's monotonic clock).
CHALLENGE_VERSION = 1
#: Version byte of a tier challenge (expiry on the wall clock, epoch ms).
TIER_CHALLENGE_VERSION = 2
CHALLENGE_RANDOM_BYTES = 16
CHALLENGE_MAC_BYTES = 16
CHALLENGE_BYTES = 1 + 8 + CHALLENGE_RANDOM_BYTES + CHALLENGE_MAC_BYTES
#: How long an enrolment challenge is accepted.
DEFAULT_CHALLENGE_TTL_S = 120.0
#: How far the wall clocks of a tier's replicas may disagree (tier mode).
DEFAULT_CLOCK_SKEW_S = 30.0
#: Fewest bytes of a tier secret (Store.tier_secret has 32).
MIN_SECRET_BYTES = 32
#: What the challenge MAC key is derived for (domain separation).
_MAC_KEY_LABEL = b"fedmask enrolment challenge mac v1"
_FOREIGN = "the enrolment challenge was not issued by this coordinator; ask for a new one"


def _hmac(key: bytes, data: bytes) -> bytes:
    h = hmac.HMAC(key, hashes.SHA256())
    h.update(data)
    return h.finalize()


class EnrollChallenges:
    """Issues and checks enrolment challenges (see the module doc)."""

    def __init__(self, *, clock: Callable[[], float], ttl_s: float = DEFAULT_CHALLENGE_TTL_S,
                 random_bytes: Callable[[int], bytes] = os.urandom, tier_secret: bytes | None = None,
                 skew_s: float = DEFAULT_CLOCK_SKEW_S) -> None:
        """Process mode without `tier_secret` (`clock`: monotonic seconds,
        read by this object only; `skew_s` unused). Tier mode with it
        (`clock`: epoch seconds, time.time or the like, on every replica;
        `skew_s`: the allowance for their disagreement, >= 0)."""
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        if tier_secret is not None and len(tier_secret) < MIN_SECRET_BYTES:
            raise ValueError(f"a tier secret has at least {MIN_SECRET_BYTES} bytes")
        if skew_s < 0:
            raise ValueError("skew_s must be >= 0")
        self._clock = clock
        self.ttl_s = ttl_s
        self._random = random_bytes
        self.tier = tier_secret is not None
        self.skew_s = skew_s if self.tier else 0.0
        self._version = TIER_CHALLENGE_VERSION if self.tier else CHALLENGE_VERSION
        secret = tier_secret if tier_secret is not None else random_bytes(32)
        self._key = _hmac(secret, _MAC_KEY_LABEL)

    def _mac(self, body: bytes) -> bytes:
        return _hmac(self._key, body)[:CHALLENGE_MAC_BYTES]

    def issue(self) -> bytes:
        expires_ms = int((self._clock() + self.ttl_s) * 1000)
        body = bytes([self._version]) + struct.pack(">Q", max(0, expires_ms)) + self._random(CHALLENGE_RANDOM_BYTES)
        return body + self._mac(body)

    def refusal(self, challenge: bytes) -> str | None:
        """None when `challenge` was issued by this object (tier mode: by
        any object with the same secret) and has not expired; otherwise
        why not (safe to send back)."""
        if not challenge:
            return "the EnrollRequest carries no challenge: this coordinator needs fedmask.v1.1 (upgrade the edge client)"
        if len(challenge) != CHALLENGE_BYTES or challenge[0] != self._version:
            return _FOREIGN
        body, mac = challenge[:-CHALLENGE_MAC_BYTES], challenge[-CHALLENGE_MAC_BYTES:]
        if not constant_time.bytes_eq(mac, self._mac(body)):
            return _FOREIGN
        (expires_ms,) = struct.unpack(">Q", body[1:9])
        now = self._clock()
        if now * 1000 > expires_ms + self.skew_s * 1000:
            return "the enrolment challenge expired; ask for a new one"
        if self.tier and expires_ms > (now + self.ttl_s + self.skew_s) * 1000:
            return "the enrolment challenge expires too late (a coordinator's clock is off); ask for a new one"
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
    "DEFAULT_CLOCK_SKEW_S",
    "EnrollChallenges",
    "enrollment_refusal",
    "proven_devices",
]
