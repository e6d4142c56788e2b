"""The event hub (coordinator/events.py): ordered, gap-free sequences per
watcher, a full queue drops only that watcher, a cap on watchers, and
shutdown ends every watcher. Also the wall-clock stage timeline of
coordinator/live_state.py."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from coordinator.events import EventHub, HubClosed, WatcherDropped, WatcherLimit
from coordinator.live_state import RoundTimeline
from fedmask_proto.v1 import admin_service_pb2 as A

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def _hub(queue: int = 3, watchers: int = 2) -> EventHub:
    return EventHub(queue_size=queue, max_watchers=watchers, wall_clock=lambda: T0)


def test_watchers_see_every_event_in_order_and_a_full_queue_drops_only_its_watcher() -> None:
    async def main() -> None:
        hub = _hub()
        fast, slow = hub.watch(), hub.watch()
        got: list[int] = []
        for i in range(5):
            hub.publish(federation_changed=A.FederationChanged(action=f"a{i}"))
            got.append((await fast.next()).sequence)
        assert got == [1, 2, 3, 4, 5]
        assert hub.watchers == 1 and hub.dropped == 1  # the slow one overflowed at the 4th event
        with pytest.raises(WatcherDropped):
            await slow.next()
        event = hub.publish(round_committed=A.RoundCommittedEvent(round_number=7))
        assert event.at.ToDatetime(tzinfo=UTC) == T0 and event.sequence == 6
        assert (await fast.next()).round_committed.round_number == 7

    asyncio.run(main())


def test_watcher_cap_and_shutdown() -> None:
    async def main() -> None:
        hub = _hub(watchers=1)
        w = hub.watch()
        with pytest.raises(WatcherLimit):
            hub.watch()
        waiting = asyncio.create_task(w.next())
        await asyncio.sleep(0)
        hub.close()
        with pytest.raises(HubClosed):
            await waiting
        with pytest.raises(HubClosed):
            hub.watch()
        with pytest.raises(ValueError):
            EventHub(queue_size=0, max_watchers=1, wall_clock=lambda: T0)

    asyncio.run(main())


def test_round_timeline_closes_the_previous_stage() -> None:
    t = RoundTimeline()
    assert t.open("advertise_keys", at=T0, deadline_in=5.0) is None
    assert t.open("advertise_keys", at=T0 + timedelta(seconds=1), deadline_in=5.0) is None  # no repeat
    closed = t.open("share_keys", at=T0 + timedelta(seconds=2.5), deadline_in=float("inf"))
    assert closed is not None and closed.phase == "advertise_keys" and closed.duration == 2.5
    assert closed.deadline_at == T0 + timedelta(seconds=5)
    assert [m.phase for m in t.marks] == ["advertise_keys", "share_keys"] and t.marks[-1].deadline_at is None
