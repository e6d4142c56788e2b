"""Fan-out of the coordinator's admin events to any number of watchers.

    hub = EventHub(queue_size=256, max_watchers=64, wall_clock=utc_now)
    hub.publish(stage_changed=...)     # stamps sequence and time; never blocks
    watcher = hub.watch()              # WatcherLimit when max_watchers watch
    event = await watcher.next()       # WatcherDropped once it fell behind
    hub.unwatch(watcher)

Contract:
  * `publish` never blocks and never fails because of a watcher: it appends
    to each watcher's bounded queue; a watcher whose queue is full is
    dropped at once (its queued events are discarded and its next `next()`
    raises WatcherDropped), so a slow reader never slows a round.
  * Sequence numbers are 1, 2, 3, ... per hub (one coordinator process); a
    watcher that keeps up sees every event after it started watching, in
    order, without gaps.
  * `close()` (shutdown) ends every watcher: `next()` raises HubClosed.

Runs on the coordinator's event loop (not thread-safe).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from datetime import datetime
from typing import Any

from fedmask_proto.v1 import admin_service_pb2

Event = admin_service_pb2.AdminEvent


class WatcherDropped(Exception):
    """The watcher fell `queue_size` events behind and was dropped."""


class HubClosed(Exception):
    """The coordinator is shutting down."""


class WatcherLimit(Exception):
    """max_watchers watchers are watching already."""


class Watcher:
    """One subscriber's bounded queue of events."""

    def __init__(self, queue_size: int) -> None:
        self._events: deque[Event] = deque()
        self._size = queue_size
        self._wake = asyncio.Event()
        self.dropped = False
        self.closed = False

    def _offer(self, event: Event) -> bool:
        """Queue `event`; False (and dropped) when the queue is full."""
        if len(self._events) >= self._size:
            self.dropped = True
            self._events.clear()
            self._wake.set()
            return False
        self._events.append(event)
        self._wake.set()
        return True

    def _close(self) -> None:
        self.closed = True
        self._wake.set()

    async def next(self) -> Event:
        """The next event; raises WatcherDropped or HubClosed."""
        while True:
            if self.dropped:
                raise WatcherDropped("the watcher fell behind and was dropped")
            if self._events:
                return self._events.popleft()
            if self.closed:
                raise HubClosed("the coordinator is shutting down")
            self._wake.clear()
            await self._wake.wait()


class EventHub:
    """See the module doc."""

    def __init__(self, *, queue_size: int, max_watchers: int, wall_clock: Callable[[], datetime]) -> None:
        if queue_size < 1 or max_watchers < 1:
            raise ValueError("queue_size and max_watchers must be >= 1")
        self._size = queue_size
        self._max = max_watchers
        self._wall = wall_clock
        self._watchers: set[Watcher] = set()
        self.sequence = 0
        #: watchers dropped for falling behind since start (metrics, tests)
        self.dropped = 0
        self._closed = False

    @property
    def watchers(self) -> int:
        return len(self._watchers)

    def watch(self) -> Watcher:
        if self._closed:
            raise HubClosed("the coordinator is shutting down")
        if len(self._watchers) >= self._max:
            raise WatcherLimit(f"{self._max} watchers are watching already")
        w = Watcher(self._size)
        self._watchers.add(w)
        return w

    def unwatch(self, watcher: Watcher) -> None:
        self._watchers.discard(watcher)

    def stamp(self, event: Event) -> Event:
        """`event` with the next sequence number and the time now (not queued)."""
        self.sequence += 1
        event.sequence = self.sequence
        event.at.FromDatetime(self._wall())
        return event

    def publish(self, **case: Any) -> Event:
        """Publish one event given as its oneof case (stage_changed=...,
        round_committed=..., ...); returns it stamped."""
        event = self.stamp(Event(**case))
        for w in list(self._watchers):
            if not w._offer(event):
                self._watchers.discard(w)
                self.dropped += 1
        return event

    def close(self) -> None:
        self._closed = True
        for w in self._watchers:
            w._close()
        self._watchers.clear()


__all__ = ["EventHub", "HubClosed", "Watcher", "WatcherDropped", "WatcherLimit"]
