"""admin/live_cache.py: the live-state cache behind GET /v1/rounds/current (D58)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from admin.live import LiveError
from admin.live_cache import LiveStateCache
from fedmask_proto.v1 import admin_service_pb2 as pb


class FakeCoordinator:
    """GetLiveState whose answers carry a counter (model_version = call number);
    `gate` holds every call until set; `fail` makes the next calls raise."""

    def __init__(self) -> None:
        self.calls = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail = False

    async def live_state(self) -> pb.LiveState:
        self.calls += 1
        n = self.calls
        await self.gate.wait()
        if self.fail:
            raise LiveError(grpc.StatusCode.UNAVAILABLE, "down")
        return pb.LiveState(model_version=n)


async def settle() -> None:
    """Let every ready task run (a get, then the call it started)."""
    for _ in range(5):
        await asyncio.sleep(0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _cache(coord: FakeCoordinator, clock: Clock, max_age: float = 0.25, stale: float = 1.0) -> LiveStateCache:
    return LiveStateCache(coord.live_state, max_age_s=max_age, stale_s=stale, clock=clock)


def test_fresh_state_is_answered_without_a_call_and_stale_state_while_one_refresh_runs() -> None:
    async def main() -> None:
        coord, clock = FakeCoordinator(), Clock()
        cache = _cache(coord, clock)
        assert (await cache.get()).model_version == 1
        clock.now += 0.2
        assert (await cache.get()).model_version == 1 and coord.calls == 1  # within max age: no call
        clock.now += 0.3  # 0.5 s old: stale, answered at once, one refresh in the background
        coord.gate.clear()
        answers = [await cache.get() for _ in range(5)]
        await settle()  # the background refresh starts
        assert [a.model_version for a in answers] == [1] * 5 and coord.calls == 2
        coord.gate.set()
        await settle()
        assert (await cache.get()).model_version == 2 and coord.calls == 2

    asyncio.run(main())


def test_too_old_state_waits_for_one_shared_call_and_errors_reach_every_waiter() -> None:
    async def main() -> None:
        coord, clock = FakeCoordinator(), Clock()
        cache = _cache(coord, clock)
        await cache.get()
        clock.now += 1.5  # older than stale_s: callers wait
        coord.gate.clear()
        waiting = [asyncio.create_task(cache.get()) for _ in range(10)]
        await settle()
        assert not any(t.done() for t in waiting) and coord.calls == 2  # single flight
        coord.gate.set()
        assert {t.model_version for t in await asyncio.gather(*waiting)} == {2}

        clock.now += 1.5
        coord.fail = True
        results = await asyncio.gather(*(cache.get() for _ in range(3)), return_exceptions=True)
        assert all(isinstance(r, LiveError) for r in results) and coord.calls == 3
        coord.fail = False
        assert (await cache.get()).model_version == 4  # a failed call is not cached: the next read retries

    asyncio.run(main())


def test_invalidate_drops_the_state_and_the_refresh_in_flight() -> None:
    async def main() -> None:
        coord, clock = FakeCoordinator(), Clock()
        cache = _cache(coord, clock)
        await cache.get()
        clock.now += 0.5
        coord.gate.clear()
        assert (await cache.get()).model_version == 1  # stale answer; refresh 2 in flight
        cache.invalidate()  # e.g. after a pause: refresh 2 may hold the state before it
        reader = asyncio.create_task(cache.get())
        await settle()
        assert coord.calls == 3  # a new call, not the one in flight
        coord.gate.set()
        assert (await reader).model_version == 3
        await settle()
        assert (await cache.get()).model_version == 3  # refresh 2's late answer was not kept

    asyncio.run(main())


def test_zero_ages_turn_the_cache_off_and_bad_ages_are_refused() -> None:
    async def main() -> None:
        coord, clock = FakeCoordinator(), Clock()
        cache = _cache(coord, clock, max_age=0, stale=0)
        clock.now += 1e-6
        await cache.get()
        clock.now += 1e-6
        await cache.get()
        assert coord.calls == 2

    asyncio.run(main())
    with pytest.raises(ValueError):
        LiveStateCache(FakeCoordinator().live_state, max_age_s=2, stale_s=1)
