"""A short-lived cache of the coordinator's live state (D58).

`GET /v1/rounds/current` and `GET /v1/federation` read the live state
through `LiveStateCache.get()` instead of one `GetLiveState` call per
request, so that many pollers (dashboards, load balancers' health checks,
scripts) cost the coordinator at most one call at a time, and a request
does not wait behind the coordinator's event loop while a round's
secure-aggregation work keeps it busy:

- a state fetched at most `max_age_s` ago is answered at once;
- an older one, up to `stale_s`, is answered at once too, while one
  refresh runs in the background (stale while revalidate);
- with nothing younger than `stale_s`, the request waits for the refresh
  (one call in flight, shared by every waiting request; its error, a
  `LiveError`, goes to each of them).

Age runs from the moment the call that fetched a state was sent, so it is
never understated; the state's own `as_of` (the coordinator's clock) is in
every answer. `invalidate()` (after an operator action) drops the cached
state and any refresh already in flight, so the next read sees the action.
`max_age_s = stale_s = 0` turns the cache off (every read is a call).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable

from fedmask_proto.v1 import admin_service_pb2 as pb


class LiveStateCache:
    def __init__(self, fetch: Callable[[], Awaitable[pb.LiveState]], *, max_age_s: float, stale_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not (0 <= max_age_s <= stale_s and math.isfinite(stale_s)):
            raise ValueError(f"need 0 <= max_age_s <= stale_s, got {max_age_s} and {stale_s}")
        self._fetch = fetch
        self._max_age = max_age_s
        self._stale = stale_s
        self._clock = clock
        self._value: pb.LiveState | None = None
        self._fetched_at = -math.inf
        self._generation = 0
        self._pending: asyncio.Future[pb.LiveState] | None = None
        self._pending_generation = -1

    async def get(self) -> pb.LiveState:
        """The live state (see the module doc); LiveError when it must wait and the call fails."""
        age = self._clock() - self._fetched_at
        if self._value is not None and age <= self._max_age:
            return self._value
        pending = self._refresh()
        if self._value is not None and age <= self._stale:
            return self._value
        return await asyncio.shield(pending)

    def invalidate(self) -> None:
        self._value = None
        self._fetched_at = -math.inf
        self._generation += 1

    def _refresh(self) -> asyncio.Future[pb.LiveState]:
        """The refresh in flight for the current generation, started if there is none."""
        if self._pending is None or self._pending.done() or self._pending_generation != self._generation:
            self._pending = asyncio.ensure_future(self._call(self._generation))
            self._pending_generation = self._generation
            # a background refresh nobody awaits must not log "exception never retrieved"
            self._pending.add_done_callback(lambda f: f.cancelled() or f.exception())
        return self._pending

    async def _call(self, generation: int) -> pb.LiveState:
        sent = self._clock()
        state = await self._fetch()
        if generation == self._generation and sent >= self._fetched_at:
            self._value, self._fetched_at = state, sent
        return state


__all__ = ["LiveStateCache"]
