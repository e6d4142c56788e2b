"""The coordinator's periodic sweep of its device streams: every half
heartbeat interval it ends the sessions that have been silent for
`SILENT_INTERVALS` heartbeat intervals and applies the revocations made in
the store (by the admin service or another replica). Runs on the
coordinator's event loop until `stopping()` or cancellation."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from coordinator.logs import log_event
from coordinator.registry import ClientSession, DeviceRegistry

SILENT_INTERVALS = 3


async def reap_silent_sessions(registry: DeviceRegistry, *, interval: float, stopping: Callable[[], bool],
                               close_session: Callable[[ClientSession, str], None]) -> None:
    """See the module doc; a store outage is logged and retried next sweep."""
    limit = SILENT_INTERVALS * interval
    try:
        while not stopping():
            await asyncio.sleep(interval / 2)
            for s in registry.silent_sessions(limit):
                s.end(grpc.StatusCode.DEADLINE_EXCEEDED, f"no message for {SILENT_INTERVALS} heartbeat intervals")
                close_session(s, "silent")
            try:
                await registry.refresh_revocations()
            except Exception as exc:  # a store outage: try again next tick
                log_event("revocation_refresh_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}")
    except asyncio.CancelledError:
        pass


__all__ = ["SILENT_INTERVALS", "reap_silent_sessions"]
