"""In mTLS mode (a client identity per caller) the registry's refusals
name nothing of another client: no device id, no revocation status of a
device that is not the caller's."""

from __future__ import annotations

import asyncio
import time

import pytest

from coordinator.errors import PermissionDenied
from coordinator.registry import ClientSession, DeviceRegistry
from coordinator.store import DeviceStatus, InMemoryStore, utc_now
from coordinator_fakes import identity_private, signed_enroll_request
from fedmask_proto.v1 import enrollment_pb2, session_pb2
from secagg import identity
from wire.possession import session_payload

REG: list[DeviceRegistry] = []


def request(local_id: str, key) -> enrollment_pb2.EnrollRequest:
    """A signed request over a challenge of the registry under test."""
    return signed_enroll_request(REG[-1].challenges.issue(), [key], client_name="c", local_ids=[local_id])


def registry(store: InMemoryStore) -> DeviceRegistry:
    reg = DeviceRegistry(store, heartbeat_interval=10.0, clock=time.monotonic, wall_clock=utc_now,
                         on_device_left=lambda d, why: None, on_changed=lambda: None)
    REG.append(reg)
    return reg


NONCE = b"\x07" * 32


def session(reg: DeviceRegistry, client_id: str) -> ClientSession:
    return ClientSession(sid=1, client_name="x", client_id=client_id, peer="", supported_models=frozenset(),
                         last_seen=0.0, nonce=NONCE)


def proof(device_id: int, key) -> session_pb2.DeviceProof:
    return session_pb2.DeviceProof(device_id=device_id, signature=identity.sign(key, session_payload(NONCE, device_id)))


def test_enrolment_refusals_name_only_the_callers_local_id() -> None:
    async def main():
        store = InMemoryStore()
        reg = registry(store)
        key = identity_private(1)
        mine = await reg.enroll(request("alice-phone", key), client_id="alice")
        device_id = mine.devices[0].device_id
        with pytest.raises(PermissionDenied) as info:
            await reg.enroll(request("mallory-guess", key), client_id="mallory")
        text = str(info.value)
        assert text == "device 'mallory-guess' is not yours to enrol"
        assert str(device_id) not in text and "alice" not in text
        # revoked: the owner is told; another client still only hears "not yours"
        store.set_device_status(device_id, DeviceStatus.REVOKED)
        with pytest.raises(PermissionDenied, match="^device 'mallory-guess' is not yours to enrol$"):
            await reg.enroll(request("mallory-guess", key), client_id="mallory")
        with pytest.raises(PermissionDenied) as info:
            await reg.enroll(request("alice-phone", key), client_id="alice")
        assert str(info.value) == "device 'alice-phone' is revoked"

    asyncio.run(main())


def test_admission_does_not_tell_another_client_that_a_device_is_revoked() -> None:
    async def main():
        store = InMemoryStore()
        reg = registry(store)
        key = identity_private(2)
        mine = await reg.enroll(request("alice-phone", key), client_id="alice")
        device_id = mine.devices[0].device_id
        store.set_device_status(device_id, DeviceStatus.REVOKED)
        await reg.load()
        R = session_pb2
        # without the key: not proven, which says nothing of owner or status
        unproven = await reg.admit(session(reg, "mallory"), [device_id], [proof(device_id, identity_private(9))])
        assert [r.reason for r in unproven.rejected] == [R.DEVICE_REJECTION_REASON_NOT_PROVEN]
        theirs = await reg.admit(session(reg, "mallory"), [device_id], [proof(device_id, key)])
        assert [r.reason for r in theirs.rejected] == [R.DEVICE_REJECTION_REASON_NOT_OWNED]
        own = await reg.admit(session(reg, "alice"), [device_id], [proof(device_id, key)])
        assert [r.reason for r in own.rejected] == [R.DEVICE_REJECTION_REASON_REVOKED]

    asyncio.run(main())


def test_the_welcome_is_never_overtaken_by_a_device_request() -> None:
    """A device request (top-k) may be queued for a device as soon as `open`
    binds it, right after the Welcome; the urgent lane it rides must not put
    it before the Welcome, which the client requires first (it ends the
    session otherwise)."""
    import asyncio

    from coordinator.registry import ClientSession
    from fedmask_proto.v1 import session_pb2

    session = ClientSession(sid=1, client_name="c", client_id=None, peer="", supported_models=frozenset(),
                            last_seen=0.0)
    session.send(session_pb2.ServerMessage(round_task=session_pb2.RoundTask()))  # bulk, queued earlier
    session.send(session_pb2.ServerMessage(welcome=session_pb2.Welcome()))
    session.send(session_pb2.ServerMessage(device_request=session_pb2.DeviceRequest()))

    async def drain() -> list[str]:
        out = []
        while not session.outbox.empty():
            m = await session.outbox.get()
            assert isinstance(m, session_pb2.ServerMessage)
            out.append(str(m.WhichOneof("message")))
        return out

    assert asyncio.run(drain()) == ["welcome", "device_request", "round_task"]
