"""Top-k requests reach the replica holding the device's stream
(admin/topk_routing.py, D111): through the admin service's HTTP API, with
two fake coordinator admin listeners, the default one standing for the
balancer's admin route (the leader) and another for a replica that does
not lead; and the router's own rules, on the in-memory store."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from admin.live import LiveLink
from admin.settings import CoordinatorLink, Role
from admin.topk_routing import TopKRouter, route_address
from coordinator.store import InMemoryStore, Store, StoreError, StreamClaim, StreamOwner, open_store
from admin_harness import (
    ANSWERS,
    NOT_CONNECTED,
    TOKENS,
    admin_server,
    admin_settings,
    fake_coordinator,
    fill_store,
)

DIGEST = "d" * 64


def test_a_device_s_top_k_goes_to_the_replica_holding_its_stream(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fedmask.db'}"
    store = open_store(url)
    try:
        filled = fill_store(store)
        with fake_coordinator(store, filled) as leader, fake_coordinator(store, filled) as other, \
                admin_server(admin_settings(url, leader.port)) as base, \
                httpx.Client(base_url=base, timeout=20, headers={"Authorization": f"Bearer {TOKENS[Role.RECOMMENDER]}"}) as http:
            lease = store.join_tier("replica-b", 60.0, settings_digest=DIGEST, admin_address=f"127.0.0.1:{other.port}")
            assert lease is not None
            store.publish_streams(lease, claims=[StreamClaim(ANSWERS, 7, True)])

            answer = http.get(f"/v1/devices/{ANSWERS}/recommendations", params={"k": 3})
            assert answer.status_code == 200 and len(answer.json()["items"]) == 3
            assert [r.device_id for r in other.servicer.topk_requests] == [ANSWERS]
            assert leader.servicer.topk_requests == []

            # no stream row: the default link answers, as before (the fake's offline device)
            assert http.get(f"/v1/devices/{NOT_CONNECTED}/recommendations").status_code == 503
            assert [r.device_id for r in leader.servicer.topk_requests] == [NOT_CONNECTED]

            # by handle: forwarded as the handle to the holder; an unknown handle to the default link
            http.get("/v1/users/user1/recommendations")
            http.get("/v1/users/nobody/recommendations")
            assert [r.user_handle for r in other.servicer.topk_requests[1:]] == ["user1"]
            assert [r.user_handle for r in leader.servicer.topk_requests[1:]] == ["nobody"]

            # the overview counts the tier's streams from the store: one, on a replica that does not lead
            f = http.get("/v1/federation", headers={"Authorization": f"Bearer {TOKENS[Role.VIEWER]}"}).json()
            assert f["devices_connected"] == 1 and f["replicas"] == [
                {"name": "replica-b", "leader": False, "connected": 1, "available": 1}]

            store.leave_tier(lease)  # the replica left: its streams are nobody's
            assert http.get(f"/v1/devices/{ANSWERS}/recommendations").status_code == 200
            assert [r.device_id for r in leader.servicer.topk_requests[2:]] == [ANSWERS]
            assert len(other.servicer.topk_requests) == 2
            f = http.get("/v1/federation", headers={"Authorization": f"Bearer {TOKENS[Role.VIEWER]}"}).json()
            assert f["replicas"] is None and f["devices_connected"] == 9  # no tier: the coordinator's own count
    finally:
        store.close()


class _Link:
    """A stand-in LiveLink that records its address."""

    def __init__(self, link: CoordinatorLink) -> None:
        self.address, self.closed = link.address, False

    async def close(self) -> None:
        self.closed = True


class _CountingStore:
    """The store's reads a router makes, counted (and optionally failing)."""

    def __init__(self, store: Store, *, fail: bool = False) -> None:
        self.store, self.fail = store, fail
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            if self.fail:
                raise StoreError("the store is down")
            return getattr(self.store, name)(*args, **kwargs)
        return call


def _router(store: Any, **link: Any) -> tuple[TopKRouter, Any]:
    default = object()
    settings = CoordinatorLink(address="127.0.0.1:50052", **link)
    return TopKRouter(store, default, settings, open_link=_Link), default  # type: ignore[arg-type]


def _tier(advertise: str) -> tuple[InMemoryStore, int]:
    store = InMemoryStore()
    device, _ = store.enroll_device(b"\x01" * 32, local_id="alice")
    lease = store.join_tier("replica-b", 60.0, settings_digest=DIGEST, admin_address=advertise)
    assert lease is not None
    store.publish_streams(lease, claims=[StreamClaim(device.id, 1, True)])
    return store, device.id


def test_the_router_routes_by_owner_and_keeps_one_link_per_address() -> None:
    async def main() -> None:
        store, device = _tier("127.0.0.1:7001")
        router, default = _router(store)
        first = await router.link(device_id=device)
        assert isinstance(first, _Link) and first.address == "127.0.0.1:7001"
        assert await router.link(user="alice") is first  # the same link, reused
        assert await router.link(device_id=device + 1) is default  # nobody holds that stream
        assert await router.link(user="nobody") is default
        await router.close()
        assert first.closed

    asyncio.run(main())


def test_unknown_and_known_handles_cost_the_same_reads() -> None:
    store, _ = _tier("127.0.0.1:7001")
    counting = _CountingStore(store)
    router, _ = _router(counting)
    router.owner_address(user="alice")  # reads the replicas' addresses once, then keeps them
    counting.calls.clear()
    assert router.owner_address(user="alice") == "127.0.0.1:7001"
    known = list(counting.calls)
    counting.calls.clear()
    assert router.owner_address(user="nobody") is None
    assert counting.calls == known == ["get_device_by_local_id", "stream_owner"]


def test_a_clear_text_credential_is_never_sent_to_an_advertised_host(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        store, device = _tier("10.1.2.3:7001")
        router, default = _router(store, token=SecretStr("t" * 32))
        with caplog.at_level(logging.WARNING, logger="fedmask.admin"):
            assert await router.link(device_id=device) is default
        assert "10.1.2.3:7001" in caplog.text
        # without a credential in clear the same address is used
        open_router, _ = _router(store)
        assert (await open_router.link(device_id=device)).address == "10.1.2.3:7001"  # type: ignore[attr-defined]

    asyncio.run(main())


def test_a_store_error_takes_the_default_link() -> None:
    async def main() -> None:
        store, device = _tier("127.0.0.1:7001")
        router, default = _router(_CountingStore(store, fail=True))
        assert await router.link(device_id=device) is default

    asyncio.run(main())


def test_route_address_is_the_live_owner_s_advertised_address() -> None:
    owner = StreamOwner("replica-b", 1, True)
    assert route_address(owner, {"replica-b": "h:1"}) == "h:1"
    assert route_address(owner, {"replica-b": None}) is None  # it advertised none
    assert route_address(owner, {"replica-c": "h:2"}) is None
    assert route_address(None, {"replica-b": "h:1"}) is None


def test_the_link_is_a_live_link_by_default() -> None:
    router = TopKRouter(InMemoryStore(), LiveLink(CoordinatorLink()), CoordinatorLink())
    assert router.owner_address(device_id=1) is None
