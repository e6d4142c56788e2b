"""What a device signs to prove possession of its Ed25519 identity key
(fedmask.v1.1), shared by the coordinator (verifies) and the edge client
(signs). Pure bytes: signing and verifying are `secagg.identity.sign` /
`verify` with the device's identity key.

Each payload starts with its own purpose label, so a signature made for one
purpose (or for a secagg transcript, whose labels start "fedmask/secagg/")
never verifies as another. Variable-length fields are length-prefixed.

- enrolment: label || challenge || client_name || local_id || identity key.
  The challenge is the coordinator's (EnrollChallenge), so a signature binds
  the enrolment to that coordinator and a short validity.
- session:   label || nonce || device_id (u64). The nonce is fresh per
  Session stream (SessionChallenge), so a proof is good on that stream only.
"""

from __future__ import annotations

import struct

ENROLLMENT_LABEL = b"fedmask/possession/v1/enroll\x00"
SESSION_LABEL = b"fedmask/possession/v1/session\x00"
#: Size of the session nonce the coordinator sends (random bytes).
SESSION_NONCE_BYTES = 32
#: Largest enrolment challenge a client echoes (the coordinator's are smaller).
MAX_CHALLENGE_BYTES = 64


def _field(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def enrollment_payload(challenge: bytes, client_name: str, local_id: str, identity_public_key: bytes) -> bytes:
    """The bytes a device signs in its DeviceEnrollment.possession_signature."""
    return (ENROLLMENT_LABEL + _field(challenge) + _field(client_name.encode())
            + _field(local_id.encode()) + _field(identity_public_key))


def session_payload(nonce: bytes, device_id: int) -> bytes:
    """The bytes a device signs in its DeviceProof on the stream of `nonce`."""
    return SESSION_LABEL + _field(nonce) + struct.pack(">Q", device_id)


__all__ = [
    "ENROLLMENT_LABEL",
    "MAX_CHALLENGE_BYTES",
    "SESSION_LABEL",
    "SESSION_NONCE_BYTES",
    "enrollment_payload",
    "session_payload",
]
