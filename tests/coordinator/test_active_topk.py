"""Top-k across active replicas (D109, D111): two replicas of
`serve_active` over one PostgreSQL database, each with its own admin
listener advertised to the tier and its own devices. The admin service's
link names the leader's listener (the balancer's admin route), yet a
device whose stream the other replica holds answers through the admin
service's HTTP API, because the request goes to the holder's listener
(admin/topk_routing.py); asked at the leader, the same device is not
connected there. The overview (`/v1/federation`) lists both replicas and
counts the devices of both."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import grpc
import httpx

from admin.app import create_app
from admin.auth import token_hash
from admin.settings import AdminSettings, CoordinatorLink, Role, TokenEntry
from coordinator import active_serve
from coordinator.store import open_store
from fedmask_proto.v1 import admin_service_pb2 as A
from fedmask_proto.v1 import admin_service_pb2_grpc as A_grpc
from fedmask_proto.v1 import session_pb2 as S

import test_active_serve
from test_active_serve import replica
from test_admin_service import CatalogueModel
from test_grpc_end_to_end import L, _until

TOKEN = "recommender-token-" + "r" * 32
VIEW = "viewer-token-" + "v" * 32


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answer(req: S.DeviceRequest) -> S.DeviceResponse:
    """A device's top-k: its own id as the first item, so the answer names who computed it."""
    items = [req.device_id % 20, 1, 2][: req.top_k.k]
    return S.DeviceResponse(correlation_id=req.correlation_id, device_id=req.device_id, top_k=S.TopKResult(
        item_ids=items, scores=[0.0] * len(items), model_version=1,
        dataset_item_ids=[str(i) for i in items], titles=[""] * len(items)))


def test_a_top_k_reaches_the_replica_that_holds_the_device(postgresql_url: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(active_serve, "build_server_model", lambda name, hp: CatalogueModel(vector_length=L, items=20))
    ports = {"replica-a": _free_port(), "replica-b": _free_port()}
    base_settings = test_active_serve._settings

    def settings(url: str, name: str, **over: Any) -> Any:  # an admin listener each, advertised; no round starts
        return base_settings(url, name, **{"admin.listen": f"127.0.0.1:{ports[name]}", "admin.auth": "none",
                                           "replica.advertise_admin": f"127.0.0.1:{ports[name]}",
                                           "cohort.size": 50, "cohort.minimum": 50, **over})

    monkeypatch.setattr(test_active_serve, "_settings", settings)

    async def main() -> None:
        store = open_store(postgresql_url)
        try:
            async with replica(postgresql_url, "replica-a", seed=0, devices=2) as a:
                await asyncio.wait_for(_until(lambda: a.coord.metrics.leader._value.get() == 1, step=0.05), 20)
                async with replica(postgresql_url, "replica-b", seed=1, devices=2) as b:
                    for c in a.clients + b.clients:
                        c.on_device_request = _answer
                    held = b.devices[0].device_id
                    await asyncio.wait_for(_until(lambda: (o := store.stream_owner(held)) is not None
                                                  and o.replica == "replica-b", step=0.05), 20)
                    # asked at the leader, b's device is not connected there
                    async with grpc.aio.insecure_channel(f"127.0.0.1:{ports['replica-a']}") as ch:
                        try:
                            await A_grpc.CoordinatorAdminStub(ch).RecommendTopK(
                                A.RecommendTopKRequest(device_id=held, k=2), timeout=5)
                            raise AssertionError("the leader answered for a device it does not hold")
                        except grpc.aio.AioRpcError as exc:
                            assert exc.code() is grpc.StatusCode.UNAVAILABLE
                    admin = AdminSettings(
                        database_url=postgresql_url,
                        tokens=[TokenEntry(name="rec", role=Role.RECOMMENDER, sha256=token_hash(TOKEN)),
                                TokenEntry(name="view", role=Role.VIEWER, sha256=token_hash(VIEW))],
                        coordinator=CoordinatorLink(address=f"127.0.0.1:{ports['replica-a']}"))
                    admin_store = open_store(postgresql_url, migrate=False)
                    app = create_app(admin, store=admin_store)
                    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://admin",
                                                 headers={"Authorization": f"Bearer {TOKEN}"}) as http:
                        for device in (held, a.devices[0].device_id):  # the other replica's, the leader's own
                            r = await http.get(f"/v1/devices/{device}/recommendations", params={"k": 2})
                            assert r.status_code == 200, r.text
                            assert r.json()["device_id"] == device
                            assert r.json()["items"][0]["item_id"] == str(device % 20)
                        # the overview counts every replica's devices, not the leader's alone
                        await asyncio.wait_for(_until(lambda: store.stream_counts()["replica-a"] == (2, 2),
                                                      step=0.05), 20)  # both of a's devices available
                        f = (await http.get("/v1/federation", headers={"Authorization": f"Bearer {VIEW}"})).json()
                        assert f["devices_connected"] == 4 and f["replicas"] == [
                            {"name": "replica-a", "leader": True, "connected": 2, "available": 2},
                            {"name": "replica-b", "leader": False, "connected": 2, "available": 2}]
                    await app.state.services.topk_router.close()
                    await app.state.services.live.close()
                    admin_store.close()
        finally:
            store.close()

    asyncio.run(main())
