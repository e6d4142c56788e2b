"""Proof of possession of identity keys (coordinator/possession.py, D32):
enrolment challenges, enrolment signatures, session proofs."""

from __future__ import annotations

from coordinator.possession import CHALLENGE_BYTES, EnrollChallenges, enrollment_refusal, proven_devices
from coordinator_fakes import identity_private, signed_enroll_request
from fedmask_proto.v1 import session_pb2
from secagg import identity
from wire.possession import enrollment_payload, session_payload


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_challenges_expire_and_bind_to_the_issuing_coordinator() -> None:
    clock = Clock()
    mine, other = EnrollChallenges(clock=clock, ttl_s=60), EnrollChallenges(clock=clock, ttl_s=60)
    c = mine.issue()
    assert len(c) == CHALLENGE_BYTES and mine.issue() != c
    assert mine.refusal(c) is None
    assert "not issued by this coordinator" in (other.refusal(c) or "")
    flipped = bytes([c[0]]) + bytes([c[1] ^ 1]) + c[2:]  # a later expiry, forged
    assert "not issued by this coordinator" in (mine.refusal(flipped) or "")
    assert "upgrade the edge client" in (mine.refusal(b"") or "")
    clock.now += 60.5
    assert "expired" in (mine.refusal(c) or "")


def test_an_enrolment_is_refused_unless_every_device_signed_its_own_entry() -> None:
    keys = [identity_private(i) for i in range(3)]
    ok = signed_enroll_request(b"challenge-1", keys)
    assert enrollment_refusal(ok) is None
    stolen = signed_enroll_request(b"challenge-1", keys)
    stolen.devices[1].identity_public_key = identity.public_bytes(identity_private(99))  # someone else's key
    assert enrollment_refusal(stolen) == 1
    replayed = signed_enroll_request(b"challenge-1", keys)
    replayed.challenge = b"challenge-2"  # the signatures were over another challenge
    assert enrollment_refusal(replayed) == 0
    renamed = signed_enroll_request(b"challenge-1", keys)
    renamed.devices[2].local_id = "other"  # the signed content changed
    assert enrollment_refusal(renamed) == 2


def test_session_proofs_hold_for_their_nonce_device_and_key_only() -> None:
    k1, k2 = identity_private(1), identity_private(2)
    keys = {1: identity.public_bytes(k1), 2: identity.public_bytes(k2)}
    nonce = b"\x01" * 32

    def proof(d: int, key, n: bytes = nonce) -> session_pb2.DeviceProof:
        return session_pb2.DeviceProof(device_id=d, signature=identity.sign(key, session_payload(n, d)))

    assert proven_devices(nonce, [proof(1, k1), proof(2, k2)], [1, 2], keys) == {1, 2}
    assert proven_devices(nonce, [proof(1, k2)], [1], keys) == set()  # another device's key
    assert proven_devices(nonce, [proof(1, k1, b"\x02" * 32)], [1], keys) == set()  # another stream's nonce
    assert proven_devices(nonce, [proof(1, k1)], [2], keys) == set()  # not announced: ignored
    assert proven_devices(nonce, [proof(3, k1)], [3], keys) == set()  # unknown device
    # an enrolment signature is no session proof (purpose labels differ)
    enrol_sig = identity.sign(k1, enrollment_payload(nonce, "c", "x", keys[1]))
    assert proven_devices(nonce, [session_pb2.DeviceProof(device_id=1, signature=enrol_sig)], [1], keys) == set()
