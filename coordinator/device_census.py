"""The device counts of the registry, published when they change.

`DeviceCensus.counts()` is (enrolled, revoked, connected, available) now;
`run()` (a task of the `Coordinator`, cancelled at shutdown) waits for
`changed()` and publishes new counts to the metrics' gauges and as a
device_counts event, at most every COUNTS_INTERVAL_S (a burst of check-ins
is one event). Runs on the coordinator's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib

from coordinator.events import EventHub
from coordinator.live_state import device_counts
from coordinator.metrics import CoordinatorMetrics
from coordinator.registry import DeviceRegistry
from coordinator.store import DeviceStatus

#: Device counts are re-published at most this often (seconds).
COUNTS_INTERVAL_S = 0.25


class DeviceCensus:
    """See the module doc."""

    def __init__(self, registry: DeviceRegistry, *, metrics: CoordinatorMetrics, events: EventHub) -> None:
        self._registry = registry
        self._metrics = metrics
        self._events = events
        self._dirty = asyncio.Event()
        self._published: tuple[int, int, int, int] | None = None

    def counts(self) -> tuple[int, int, int, int]:
        """(enrolled, revoked, connected, available) now."""
        reg = self._registry
        revoked = sum(1 for rec in reg.devices.values() if rec.status is not DeviceStatus.ACTIVE)
        open_sessions = [s for s in reg.sessions.values() if not s.closed]
        return (len(reg.devices), revoked, sum(len(s.devices) for s in open_sessions),
                sum(len(s.available) for s in open_sessions))

    def changed(self) -> None:
        """The counts may have changed: publish them soon."""
        self._dirty.set()

    async def run(self) -> None:
        """Publish the counts when they changed, until cancelled."""
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                await self._dirty.wait()
                self._dirty.clear()
                counts = self.counts()
                if counts != self._published:
                    self._published = counts
                    enrolled, revoked, connected, available = counts
                    self._metrics.devices(enrolled=enrolled, connected=connected, available=available)
                    self._events.publish(device_counts=device_counts(
                        enrolled=enrolled, revoked=revoked, connected=connected, available=available))
                await asyncio.sleep(COUNTS_INTERVAL_S)


__all__ = ["COUNTS_INTERVAL_S", "DeviceCensus"]
