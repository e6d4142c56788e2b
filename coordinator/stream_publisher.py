"""Publishing the device streams a replica holds to the store, so that the
tier knows which replica hosts which device (`publish_streams`,
coordinator/store/replica_interface.py).

`StreamPublisher` hears the registry's hosting changes
(`DeviceRegistry.watch_streams`) and, at most every `publish_interval_s`,
writes all that changed since the last publish in ONE `publish_streams`
call, fenced by the replica's membership term (coordinator/membership.py),
on a worker thread: the event loop never waits for the store. Contract:
  * A stream that admitted a device is a claim under the stream's `sid`
    (its `session_key`); a change of availability is written as the
    snapshot of every held device's availability; a device no stream
    hosts any more is released. Between publishes the changes coalesce
    (`PendingStreams`): only the state at publish time is written.
  * Devices the store answers as `displaced` (another replica, or an
    earlier term, holds their rows) are released here through
    `DeviceRegistry.release_remote`, as a local displacement would be;
    unless the device reconnected here since, which is claimed again.
  * Every `resync_interval_s` a replica holding devices publishes even
    without a change, so it learns of displacements while idle.
  * FencedOut (the membership term is over): nothing was written; the
    publisher stops and calls `on_lost(reason)` once; the replica must stop
    serving (NOT_SERVING, exit code 3, as a deposed leader does, D90).
  * Any other StoreError is logged and retried with exponential backoff
    (from `publish_interval_s` up to `max_backoff_s`); the failed
    publish's changes stay pending, so nothing is lost, and a claim whose
    outcome is unknown is released later if its stream closed meanwhile.
    Other exceptions (bugs) end `run()` with that exception.
Runs on the event loop, as the registry does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from coordinator.logs import log_event
from coordinator.registry import DeviceRegistry
from coordinator.store import FencedOut, Lease, Store, StoreError, StreamClaim, StreamSync

DEFAULT_PUBLISH_INTERVAL_S = 0.25
DEFAULT_RESYNC_INTERVAL_S = 5.0
DEFAULT_MAX_BACKOFF_S = 5.0
#: Why a device another replica took leaves its stream here.
DISPLACED_WHY = "reconnected to another replica"

Outcome = Literal["idle", "published", "failed", "fenced"]


@dataclass(frozen=True, slots=True)
class Hold:
    """A device hosted by stream `session_key`, available or not."""

    session_key: int
    available: bool


@dataclass(frozen=True, slots=True)
class Publish:
    """One `publish_streams` request and the hosting it was built from."""

    claims: tuple[StreamClaim, ...]
    availability: dict[int, bool]
    released: tuple[int, ...]
    held: dict[int, Hold] = field(repr=False)

    @property
    def empty(self) -> bool:
        """Nothing held and nothing to release: no call to make."""
        return not (self.claims or self.availability or self.released)


class PendingStreams:
    """The pure part of the publisher: the hosting the registry reports
    (`hosting`, the latest state per device) against what the store holds
    by the publishes it acknowledged (`_stored`). A publish is their
    difference, so the merge rules follow from "the state at publish time
    wins": a claim then a release of a device never published writes
    nothing; a release then a claim by a new stream is one claim under the
    new session key; a change of availability after a claim rides in the
    claim. A device whose claim may have been written by a publish that
    failed is `_uncertain`: released if no stream hosts it at the next
    publish, claimed again otherwise."""

    def __init__(self) -> None:
        self.hosting: dict[int, Hold] = {}
        self._stored: dict[int, Hold] = {}
        self._uncertain: set[int] = set()

    def hosted(self, device_id: int, session_key: int, available: bool | None) -> None:
        """Stream `session_key` hosts the device (`available`), or no longer
        does (None; ignored when another stream hosts it by now)."""
        if available is not None:
            self.hosting[device_id] = Hold(session_key, available)
        elif (held := self.hosting.get(device_id)) is not None and held.session_key == session_key:
            del self.hosting[device_id]

    @property
    def changed(self) -> bool:
        """Whether the store lags behind the hosting."""
        return self.hosting != self._stored or bool(self._uncertain - set(self.hosting))

    def next_publish(self) -> Publish:
        """The request that brings the store to the hosting now: a claim
        for each device not stored under its stream, the availability of
        every other held device (the snapshot the store compares), the
        release of each device stored or uncertain that no stream hosts."""
        claims = tuple(StreamClaim(d, h.session_key, h.available) for d, h in sorted(self.hosting.items())
                       if (s := self._stored.get(d)) is None or s.session_key != h.session_key)
        claimed = {c.device_id for c in claims}
        availability = {d: h.available for d, h in sorted(self.hosting.items()) if d not in claimed}
        released = tuple(sorted((set(self._stored) | self._uncertain) - set(self.hosting)))
        return Publish(claims, availability, released, dict(self.hosting))

    def published(self, publish: Publish, displaced: frozenset[int]) -> list[int]:
        """The store acknowledged `publish`; returns the displaced devices
        still hosted by the stream the publish named, which the registry
        must release (one hosted by a newer stream since is kept, to be
        claimed by the next publish)."""
        for c in publish.claims:
            self._stored[c.device_id] = Hold(c.session_key, c.available)
            self._uncertain.discard(c.device_id)
        for d, available in publish.availability.items():
            if d not in displaced:
                self._stored[d] = Hold(self._stored[d].session_key, available)
        for d in publish.released:
            self._stored.pop(d, None)
            self._uncertain.discard(d)
        drop: list[int] = []
        for d in sorted(displaced):
            self._stored.pop(d, None)
            then, now = publish.held.get(d), self.hosting.get(d)
            if then is not None and now is not None and now.session_key == then.session_key:
                del self.hosting[d]  # the stream the store no longer names (its availability may have moved)
                drop.append(d)
        return drop

    def failed(self, publish: Publish) -> None:
        """`publish` raised: its claims may or may not have been written."""
        self._uncertain.update(c.device_id for c in publish.claims)


class StreamPublisher:
    """Publishes one replica's streams (see the module doc)."""

    def __init__(self, store: Store, registry: DeviceRegistry, member: Callable[[], Lease], *,
                 on_lost: Callable[[str], None], publish_interval_s: float = DEFAULT_PUBLISH_INTERVAL_S,
                 resync_interval_s: float = DEFAULT_RESYNC_INTERVAL_S, max_backoff_s: float = DEFAULT_MAX_BACKOFF_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`member`: the replica's membership term (MembershipKeeper.member);
        `on_lost(reason)`: called once, on the event loop, when a publish
        found the term over. Starts hearing the registry at once."""
        if not (publish_interval_s > 0 and resync_interval_s > 0 and max_backoff_s >= publish_interval_s):
            raise ValueError("publish_interval_s, resync_interval_s > 0 and max_backoff_s >= publish_interval_s")
        self._store, self._registry, self._member, self._on_lost = store, registry, member, on_lost
        self.publish_interval_s, self.resync_interval_s = publish_interval_s, resync_interval_s
        self.max_backoff_s, self._clock = max_backoff_s, clock
        self.pending = PendingStreams()
        self._wake, self._stopped = asyncio.Event(), asyncio.Event()
        self._stopping = False
        self.lost: str | None = None
        self.failures = 0  # consecutive failed publishes
        self.publishes = 0  # publish_streams calls answered (tests, metrics)
        registry.watch_streams(self._heard)

    def _heard(self, device_id: int, session_key: int, available: bool | None) -> None:
        self.pending.hosted(device_id, session_key, available)
        self._wake.set()

    def stop(self) -> None:
        """End `run()` (after a publish in flight)."""
        self._stopping = True
        self._stopped.set()
        self._wake.set()

    async def publish_once(self) -> Outcome:
        """One publish of all pending changes, now: "idle" (nothing to
        write or learn), "published", "failed" (a store error, logged; the
        changes stay pending) or "fenced" (membership lost: `on_lost`
        called, the publisher stopped)."""
        if self.lost is not None:
            return "fenced"
        publish = self.pending.next_publish()
        if publish.empty:
            return "idle"
        try:
            sync = await asyncio.to_thread(self._call, publish)
        except FencedOut as exc:
            self.pending.failed(publish)
            self.lost = f"the membership term is over: {str(exc)[:200]}"
            self.stop()
            log_event("membership_lost", logging.ERROR, reason=self.lost)
            self._on_lost(self.lost)
            return "fenced"
        except StoreError as exc:
            self.pending.failed(publish)
            self.failures += 1
            log_event("streams_publish_failed", logging.WARNING, failures=self.failures,
                      retry_in_s=round(self._backoff(), 3), error=str(exc)[:200])
            return "failed"
        self.failures = 0
        self.publishes += 1
        drop = self.pending.published(publish, sync.displaced)
        if drop:
            self._registry.release_remote(drop, why=DISPLACED_WHY)
        return "published"

    def _call(self, publish: Publish) -> StreamSync:
        return self._store.publish_streams(self._member(), claims=publish.claims, availability=publish.availability,
                                           released=publish.released)

    def _backoff(self) -> float:
        return min(self.publish_interval_s * 2.0 ** self.failures, self.max_backoff_s)

    async def run(self) -> None:
        """Publish until `stop()` or the membership is lost: after a change
        (coalescing those of `publish_interval_s`), after a failure (with
        backoff, whatever changes meanwhile), and every `resync_interval_s`
        while devices are held; a replica holding nothing waits for a change."""
        last, idle = -float("inf"), False
        while not self._stopping:
            if self.failures:
                await self._wait(self._stopped, last + self._backoff() - self._clock())
            elif not self.pending.changed:
                self._wake.clear()
                await self._wait(self._wake, None if idle else last + self.resync_interval_s - self._clock())
            if not self._stopping:  # coalesce: at most one publish per interval
                await self._wait(self._stopped, last + self.publish_interval_s - self._clock())
            if self._stopping:
                break
            last = self._clock()
            idle = await self.publish_once() == "idle"

    @staticmethod
    async def _wait(event: asyncio.Event, seconds: float | None) -> None:
        """Until `event` is set or `seconds` (None: no limit) passed."""
        if seconds is not None and seconds <= 0:
            return
        try:
            await asyncio.wait_for(event.wait(), timeout=seconds)
        except TimeoutError:
            pass


__all__ = ["DISPLACED_WHY", "Hold", "PendingStreams", "Publish", "StreamPublisher"]
