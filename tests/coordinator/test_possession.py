"""Proof of possession of identity keys (coordinator/possession.py, D32):
enrolment challenges, enrolment signatures, session proofs."""

from __future__ import annotations

import pytest

from coordinator.possession import (
    CHALLENGE_BYTES,
    DEFAULT_CLOCK_SKEW_S,
    EnrollChallenges,
    enrollment_refusal,
    proven_devices,
)
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


SECRET = bytes(range(32))
EPOCH = 1_800_000_000.0  # a wall-clock reading (epoch seconds)


def tier(clock: Clock, secret: bytes = SECRET, skew_s: float = 5.0) -> EnrollChallenges:
    return EnrollChallenges(clock=clock, ttl_s=60, tier_secret=secret, skew_s=skew_s)


def test_a_tier_challenge_is_accepted_by_any_replica_with_the_tiers_secret() -> None:
    issuer_clock, verifier_clock = Clock(), Clock()
    issuer_clock.now = verifier_clock.now = EPOCH
    issuer, verifier = tier(issuer_clock), tier(verifier_clock)  # two replicas, one secret
    c = issuer.issue()
    assert len(c) == CHALLENGE_BYTES
    assert verifier.refusal(c) is None and issuer.refusal(c) is None
    assert verifier.refusal(verifier.issue()) is None and issuer.refusal(verifier.issue()) is None
    # another tier (another secret), and a process-mode coordinator, refuse it
    assert "not issued by this coordinator" in (tier(verifier_clock, bytes(32)).refusal(c) or "")
    assert "not issued by this coordinator" in (EnrollChallenges(clock=verifier_clock, ttl_s=60).refusal(c) or "")
    # a process challenge is no tier challenge, even at the same clock reading
    assert "not issued by this coordinator" in (issuer.refusal(EnrollChallenges(clock=issuer_clock).issue()) or "")
    with pytest.raises(ValueError, match="32 bytes"):
        tier(issuer_clock, b"short")


def test_a_tampered_tier_challenge_is_refused() -> None:
    clock = Clock()
    clock.now = EPOCH
    replica = tier(clock)
    c = replica.issue()
    for i in range(CHALLENGE_BYTES):  # any one bit of any byte: version, expiry, random part, MAC
        forged = c[:i] + bytes([c[i] ^ 0x01]) + c[i + 1:]
        assert "not issued by this coordinator" in (replica.refusal(forged) or ""), i
    assert "not issued by this coordinator" in (replica.refusal(c[:-1]) or "")
    assert "upgrade the edge client" in (replica.refusal(b"") or "")


def test_a_tier_challenge_expires_on_the_wall_clock_with_the_skew_allowance() -> None:
    issuer_clock, verifier_clock = Clock(), Clock()
    issuer_clock.now = EPOCH
    issuer = tier(issuer_clock, skew_s=5.0)
    verifier = tier(verifier_clock, skew_s=5.0)
    c = issuer.issue()  # expires at EPOCH + 60 by the issuer's clock
    verifier_clock.now = EPOCH + 64.9  # past the expiry, within the allowance
    assert verifier.refusal(c) is None
    verifier_clock.now = EPOCH + 65.1  # past expiry + allowance
    assert "expired" in (verifier.refusal(c) or "")
    verifier_clock.now = EPOCH - 4.9  # the verifier's clock behind the issuer's, within the allowance
    assert verifier.refusal(c) is None
    verifier_clock.now = EPOCH - 5.1  # further behind: the expiry is more than ttl + allowance ahead
    assert "expires too late" in (verifier.refusal(c) or "")
    # the wall clock, not a process's monotonic one: a verifier that
    # started later (any process) reads the same epoch time
    verifier_clock.now = EPOCH + 30.0
    assert tier(verifier_clock, skew_s=0.0).refusal(c) is None
    verifier_clock.now = EPOCH + 60.001
    assert "expired" in (tier(verifier_clock, skew_s=0.0).refusal(c) or "")
    assert issuer.skew_s == 5.0 and tier(issuer_clock).skew_s == 5.0
    assert EnrollChallenges(clock=issuer_clock, tier_secret=SECRET).skew_s == DEFAULT_CLOCK_SKEW_S
    assert EnrollChallenges(clock=issuer_clock).skew_s == 0.0  # process mode: no allowance


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
