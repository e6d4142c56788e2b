"""The registry applies revocations (and restorations) an operator wrote in
the store, reading only the revoked rows."""

from __future__ import annotations

import asyncio
import time

from coordinator.registry import ClientSession, DeviceRegistry
from coordinator.store import DeviceStatus, InMemoryStore, utc_now
from coordinator_fakes import identity_private
from fedmask_proto.v1 import session_pb2
from secagg import identity
from wire.possession import session_payload


def test_revoke_then_restore_reaches_the_cache_and_releases_the_device() -> None:
    async def main() -> None:
        store = InMemoryStore()
        left: list[tuple[int, str]] = []
        reg = DeviceRegistry(store, heartbeat_interval=10.0, clock=time.monotonic, wall_clock=utc_now,
                             on_device_left=lambda d, why: left.append((d, why)), on_changed=lambda: None)
        ka, kb = identity_private(1), identity_private(2)
        (a, _), (b, _) = store.enroll_devices([(identity.public_bytes(ka), "a"), (identity.public_bytes(kb), "b")],
                                              client_id=None)
        await reg.load()
        nonce = b"\x03" * 32
        s = ClientSession(sid=1, client_name="c", client_id=None, peer="", supported_models=frozenset(),
                          last_seen=0.0, nonce=nonce)
        reg.sessions[s.sid] = s
        await reg.admit(s, [a.id, b.id], [session_pb2.DeviceProof(device_id=d, signature=identity.sign(
            k, session_payload(nonce, d))) for d, k in ((a.id, ka), (b.id, kb))])
        store.set_device_status(a.id, DeviceStatus.REVOKED)
        assert await reg.refresh_revocations() == [a.id]
        assert reg.is_revoked(a.id) and reg.owner(a.id) is None and reg.owner(b.id) is s
        assert (a.id, "revoked by an operator") in left
        assert await reg.refresh_revocations() == []  # applied once
        store.set_device_status(a.id, DeviceStatus.ACTIVE)
        assert await reg.refresh_revocations() == []
        assert not reg.is_revoked(a.id)
        admission = await reg.admit(s, [a.id, b.id])
        assert list(admission.accepted_device_ids) == [a.id, b.id]

    asyncio.run(main())
