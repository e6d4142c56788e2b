"""Which coordinator admin listener a top-k request goes to (D111).

A device's top-k is computed on the device and relayed over the stream it
holds with one coordinator. In the single-process and standby modes every
stream is on the one coordinator behind `coordinator.address`. In the
active mode (D109) each replica holds its own devices' streams and
publishes them to the store; a request sent to the balancer's admin route
reaches the leader, which does not hold most streams. So the admin service
asks the store who holds the stream (`stream_owner`) and where that
replica's admin listener is (`ReplicaRecord.admin_address`, its
`replica.advertise_admin`), and calls that listener with the same
credential and TLS settings as `coordinator.address`.

Contract:
- `route_address` is pure: the owner's advertised admin address when the
  owner is a live replica that advertised one; otherwise None, meaning
  "the default link" (`coordinator.address`), which answers as before.
- An advertised address is used only where `CoordinatorLink`'s own checks
  accept it (HOST:PORT; a bearer token never in clear to a host that is not
  loopback). One they refuse is logged once and the default link is used:
  the store is trusted to say where streams are, not to collect the
  admin credential. With TLS the replica's certificate must name the
  advertised host, as gRPC checks it.
- A request by user handle makes the same store reads whether the handle
  is unknown, offline or online, and is forwarded with the handle itself,
  so the answering coordinator decides as before (D84: unknown and offline
  alike).
- A store error while routing is not the caller's failure: the request
  takes the default link.
- Without an active tier (no live replica in the store, reread every
  `ADDRESSES_MAX_AGE_S`) no stream is looked up: a single coordinator's
  top-k costs no store read here.
- A stream that moves between the lookup and the call answers "not
  connected" (503 with Retry-After), as any offline device does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from admin.live import LiveLink
from admin.settings import CoordinatorLink
from coordinator.store import Store, StoreError
from coordinator.store.replica_records import ReplicaRecord, StreamOwner

_log = logging.getLogger("fedmask.admin")

#: Seconds the replicas' advertised addresses are reused before a reread;
#: an owner missing from them forces a reread at once.
ADDRESSES_MAX_AGE_S = 5.0
#: Links kept open to replicas' admin listeners; the oldest is closed past it.
MAX_REPLICA_LINKS = 64
#: A device id no device has (ids start at 1): keeps the reads of an
#: unknown handle the same as those of a known one.
_NO_DEVICE = 0


def route_address(owner: StreamOwner | None, addresses: dict[str, str | None]) -> str | None:
    """The admin address of the replica holding the stream, or None (the
    default link). `addresses`: live replicas' advertised admin addresses by name."""
    if owner is None:
        return None
    return addresses.get(owner.replica)


def advertised(replicas: Sequence[ReplicaRecord]) -> dict[str, str | None]:
    """Live replicas' advertised admin addresses, by name."""
    return {r.name: r.admin_address for r in replicas}


class TopKRouter:
    """The link for one top-k request (see the module doc). `open_link`
    builds a link for an address (LiveLink; tests pass a fake)."""

    def __init__(self, store: Store, default: LiveLink, link: CoordinatorLink, *,
                 open_link: Callable[[CoordinatorLink], LiveLink] = LiveLink,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._store, self._default, self._link = store, default, link
        self._open_link, self._clock = open_link, clock
        self._addresses: dict[str, str | None] = {}
        self._read_at = float("-inf")
        self._links: dict[str, LiveLink] = {}
        self._refused: set[str] = set()

    async def link(self, *, device_id: int | None = None, user: str | None = None) -> LiveLink:
        """The link for a top-k of `device_id` or of the handle `user`
        (the store is read in a worker thread)."""
        address = await run_in_threadpool(self.owner_address, device_id=device_id, user=user)
        return await self.link_to(address)

    def owner_address(self, *, device_id: int | None = None, user: str | None = None) -> str | None:
        """Blocking (store reads): the admin address of the replica holding
        the stream of `device_id`, or of the device whose handle is `user`;
        None for the default link, a store error included."""
        try:
            self._refresh_addresses(stale_only=True)
            if not self._addresses:  # no active tier: every stream is on the default link's coordinator
                return None
            if user is not None:
                device = self._store.get_device_by_local_id(user)
                device_id = device.id if device is not None else _NO_DEVICE
            if device_id is None:
                raise ValueError("give device_id or user")
            owner = self._store.stream_owner(device_id)
            if owner is None:
                return None
            if owner.replica not in self._addresses:  # a replica that joined since the last read
                self._refresh_addresses(stale_only=False)
            return route_address(owner, self._addresses)
        except StoreError as exc:
            _log.warning("top-k routing: store read failed, using coordinator.address: %s", exc)
            return None

    def _refresh_addresses(self, *, stale_only: bool) -> None:
        """Reread the live replicas' advertised addresses (blocking), or,
        with `stale_only`, only when the last read is ADDRESSES_MAX_AGE_S old."""
        if stale_only and self._clock() - self._read_at <= ADDRESSES_MAX_AGE_S:
            return
        self._addresses = advertised(self._store.live_replicas())
        self._read_at = self._clock()

    async def link_to(self, address: str | None) -> LiveLink:
        """The link to `address` (opened once, same credential), or the
        default link for None or an address the link's checks refuse."""
        if address is None or address == self._link.address or address in self._refused:
            return self._default
        found = self._links.get(address)
        if found is not None:
            return found
        try:
            link = CoordinatorLink.model_validate({**self._link.model_dump(), "address": address})
        except ValidationError as exc:
            self._refused.add(address)
            _log.warning("top-k routing: not calling the advertised admin address %r (%s); using "
                         "coordinator.address", address, exc.errors()[0].get("msg", "invalid"))
            return self._default
        if len(self._links) >= MAX_REPLICA_LINKS:
            await self._links.pop(next(iter(self._links))).close()
        self._links[address] = opened = self._open_link(link)
        return opened

    async def close(self) -> None:
        """Close every link opened to a replica (not the default link)."""
        for link in self._links.values():
            await link.close()
        self._links.clear()
