"""Publishing a replica's device streams (coordinator/stream_publisher.py):
the pure merge rules of `PendingStreams`, then real DeviceRegistry objects
of one or two replicas over one in-memory store (whose clock the test
moves): admitted streams become rows of their replica, availability and
closes reach the store, a device that reconnected to another replica is
released here, a publish after the membership ran out is fenced (the loss
reported, nothing written), and store errors are retried without losing a
change."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import grpc
import pytest

from coordinator.membership import MembershipKeeper
from coordinator.registry import ClientSession, DeviceRegistry, StreamEnd
from coordinator.store import InMemoryStore, Lease, StoreError, StreamClaim, StreamOwner, StreamSync, utc_now
from coordinator.stream_publisher import DISPLACED_WHY, Hold, PendingStreams, StreamPublisher
from coordinator_fakes import identity_private
from fedmask_proto.v1 import session_pb2
from secagg import identity
from wire.possession import session_payload
from wire.protocol import PROTOCOL_VERSION

# ---------------------------------------------------------------- the merge rules


def acknowledge(pending: PendingStreams, displaced: Iterable[int] = ()) -> list[int]:
    return pending.published(pending.next_publish(), frozenset(displaced))


def test_a_claim_then_a_release_within_one_interval_writes_nothing() -> None:
    p = PendingStreams()
    p.hosted(7, 1, True)
    p.hosted(7, 1, None)
    assert not p.changed and p.next_publish().empty


def test_a_stored_device_released_is_released_and_then_forgotten() -> None:
    p = PendingStreams()
    p.hosted(7, 1, True)
    assert p.next_publish().claims == (StreamClaim(7, 1, True),)
    acknowledge(p)
    assert not p.changed
    p.hosted(7, 1, None)
    publish = p.next_publish()
    assert (publish.claims, publish.availability, publish.released) == ((), {}, (7,))
    acknowledge(p)
    assert not p.changed and p.next_publish().empty


def test_a_release_then_a_claim_by_a_new_stream_is_one_claim_under_the_new_key() -> None:
    p = PendingStreams()
    p.hosted(7, 1, True)
    acknowledge(p)
    p.hosted(7, 1, None)
    p.hosted(7, 2, False)
    publish = p.next_publish()
    assert (publish.claims, publish.availability, publish.released) == ((StreamClaim(7, 2, False),), {}, ())


def test_availability_after_a_claim_rides_in_the_claim_and_later_in_the_snapshot() -> None:
    p = PendingStreams()
    p.hosted(7, 1, True)
    p.hosted(7, 1, False)
    p.hosted(8, 1, True)
    assert p.next_publish().claims == (StreamClaim(7, 1, False), StreamClaim(8, 1, True))
    acknowledge(p)
    p.hosted(8, 1, False)
    publish = p.next_publish()
    assert (publish.claims, publish.availability) == ((), {7: False, 8: False})  # every held device
    acknowledge(p)
    assert not p.changed


def test_a_late_release_of_an_older_stream_leaves_the_newer_one() -> None:
    p = PendingStreams()
    p.hosted(7, 2, True)
    p.hosted(7, 1, None)  # stream 1 closed after stream 2 took the device
    assert p.hosting == {7: Hold(2, True)}


def test_a_failed_claim_is_claimed_again_or_released_if_its_stream_closed() -> None:
    p = PendingStreams()
    p.hosted(7, 1, True)
    p.hosted(8, 1, True)
    p.failed(p.next_publish())  # written or not: unknown
    p.hosted(8, 1, None)
    publish = p.next_publish()
    assert (publish.claims, publish.released) == ((StreamClaim(7, 1, True),), (8,))
    acknowledge(p)
    assert not p.changed


def test_displaced_devices_are_dropped_unless_a_new_stream_hosts_them_since() -> None:
    p = PendingStreams()
    for d in (7, 8, 9):
        p.hosted(d, 1, True)
    acknowledge(p)
    publish = p.next_publish()
    p.hosted(8, 1, False)  # the same stream, availability moved while the publish flew
    p.hosted(9, 3, True)  # reconnected here on a new stream meanwhile
    assert p.published(publish, frozenset({7, 8, 9})) == [7, 8]
    assert p.hosting == {9: Hold(3, True)}
    assert p.next_publish().claims == (StreamClaim(9, 3, True),)


# ---------------------------------------------------------------- replicas over one store


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


NONCE = b"\x05" * 32


class Replica:
    """One replica's registry, membership and publisher over the shared store."""

    def __init__(self, store: InMemoryStore, name: str, clock: Clock, **publisher: Any) -> None:
        self.left: list[tuple[int, str]] = []
        self.lost: list[str] = []
        self.registry = DeviceRegistry(store, heartbeat_interval=10.0, clock=time.monotonic, wall_clock=utc_now,
                                       on_device_left=lambda d, why: self.left.append((d, why)),
                                       on_changed=lambda: None)
        self.membership = MembershipKeeper(store, name, 10.0, settings_digest="d" * 64, clock=clock)
        self.publisher = StreamPublisher(store, self.registry, self.membership.member, on_lost=self.lost.append,
                                         **publisher)

    async def start(self) -> None:
        await self.membership.join()
        await self.registry.load()

    async def open(self, devices: Sequence[tuple[int, Any]]) -> ClientSession:
        hello = session_pb2.Hello(protocol_version=PROTOCOL_VERSION, client_name="c",
                                  available_device_ids=[d for d, _ in devices])
        proofs = [session_pb2.DeviceProof(device_id=d, signature=identity.sign(k, session_payload(NONCE, d)))
                  for d, k in devices]
        return await self.registry.open(hello, nonce=NONCE, proofs=proofs, client_id=None)


def enrolled(store: InMemoryStore, n: int) -> list[tuple[int, Any]]:
    keys = [identity_private(40 + i) for i in range(n)]
    records = store.enroll_devices([(identity.public_bytes(k), f"d{i}") for i, k in enumerate(keys)],
                                   client_id=None)
    return [(rec.id, k) for (rec, _), k in zip(records, keys, strict=True)]


async def eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 5.0
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())  # type: ignore[arg-type]


def test_an_admitted_stream_is_a_row_of_its_replica_until_it_closes() -> None:
    clock = Clock()
    store = InMemoryStore(lease_clock=clock)
    (d1, k1), (d2, k2) = enrolled(store, 2)
    a = Replica(store, "replica-a", clock)

    async def scenario() -> None:
        await a.start()
        assert await a.publisher.publish_once() == "idle"
        s = await a.open([(d1, k1), (d2, k2)])
        assert await a.publisher.publish_once() == "published"
        assert store.stream_owner(d1) == store.stream_owner(d2) == StreamOwner("replica-a", s.sid, True)
        assert store.available_by_replica() == {"replica-a": [(d1, s.sid), (d2, s.sid)]}
        await a.registry.admit(s, [d1])  # a CheckIn: d2 still hosted, not available
        assert await a.publisher.publish_once() == "published"
        assert store.stream_owner(d2) == StreamOwner("replica-a", s.sid, False)
        assert store.available_by_replica() == {"replica-a": [(d1, s.sid)]}
        a.registry.close(s)
        assert await a.publisher.publish_once() == "published"
        assert store.stream_owner(d1) is None and store.stream_owner(d2) is None
        assert await a.publisher.publish_once() == "idle"

    run(scenario)


def test_a_device_that_reconnected_to_another_replica_is_released_here() -> None:
    clock = Clock()
    store = InMemoryStore(lease_clock=clock)
    (d1, k1), (d2, k2) = enrolled(store, 2)
    a, b = Replica(store, "replica-a", clock), Replica(store, "replica-b", clock)

    async def scenario() -> None:
        await a.start()
        await b.start()
        only = await a.open([(d1, k1)])
        both = await a.open([(d2, k2)])
        await a.registry.admit(both, [d2])
        assert await a.publisher.publish_once() == "published"
        moved = await b.open([(d1, k1), (d2, k2)])  # the client reconnected to replica-b
        assert await b.publisher.publish_once() == "published"
        assert store.stream_owner(d1) == StreamOwner("replica-b", moved.sid, True)
        assert await a.publisher.publish_once() == "published"  # its snapshot finds both rows taken
        assert a.registry.owner(d1) is None and a.registry.owner(d2) is None
        assert (d1, DISPLACED_WHY) in a.left and (d2, DISPLACED_WHY) in a.left
        for stream in (only, both):  # hosting nothing: ended as a local displacement ends it
            assert stream.closed and stream.sid not in a.registry.sessions
            end = stream.outbox.get_nowait()
            while not isinstance(end, StreamEnd):
                end = stream.outbox.get_nowait()
            assert end.code is grpc.StatusCode.ABORTED and "another replica" in end.detail
        assert store.available_by_replica() == {"replica-b": [(d1, moved.sid), (d2, moved.sid)]}
        assert await a.publisher.publish_once() == "idle"  # nothing left to say: b's rows stay
        assert store.stream_owner(d2) == StreamOwner("replica-b", moved.sid, True)

    run(scenario)


def test_an_idle_replica_learns_of_a_displacement_at_its_next_resync() -> None:
    clock = Clock()
    store = InMemoryStore(lease_clock=clock)
    [(d1, k1)] = enrolled(store, 1)
    a = Replica(store, "replica-a", clock, publish_interval_s=0.05, resync_interval_s=0.2)
    b = Replica(store, "replica-b", clock)

    async def scenario() -> None:
        await a.start()
        await b.start()
        task = asyncio.create_task(a.publisher.run())
        await a.open([(d1, k1)])
        await eventually(lambda: store.stream_owner(d1) is not None, "a's claim")
        await b.open([(d1, k1)])
        assert await b.publisher.publish_once() == "published"
        await eventually(lambda: a.registry.owner(d1) is None, "a's resync to find b's claim")
        assert (d1, DISPLACED_WHY) in a.left
        owner = store.stream_owner(d1)
        assert owner is not None and owner.replica == "replica-b"
        a.publisher.stop()
        await asyncio.wait_for(task, 1.0)

    run(scenario)


def test_a_publish_after_the_membership_ran_out_is_fenced_and_reports_the_loss() -> None:
    clock = Clock()
    store = InMemoryStore(lease_clock=clock)
    [(d1, k1)] = enrolled(store, 1)
    a = Replica(store, "replica-a", clock)

    async def scenario() -> None:
        await a.start()
        await a.open([(d1, k1)])
        version = store.fleet_version()
        clock.now = 11.0  # the term expired in the store
        assert await a.publisher.publish_once() == "fenced"
        assert len(a.lost) == 1 and "membership term is over" in a.lost[0]
        assert store.stream_owner(d1) is None and store.fleet_version() == version  # nothing written
        assert await a.publisher.publish_once() == "fenced" and len(a.lost) == 1  # reported once
        await asyncio.wait_for(a.publisher.run(), 1.0)  # a stopped publisher's loop ends at once

    run(scenario)


class FlakyStore(InMemoryStore):
    """`publish_streams` fails while `failing` is above 0 (one failure per
    call); with `commit_first` it writes before it fails (an answer lost
    after the commit). Counts the calls and the threads they run on."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(lease_clock=clock)
        self.failing, self.commit_first, self.calls = 0, False, 0
        self.threads: set[int] = set()

    def publish_streams(self, member: Lease, **kw: Any) -> StreamSync:
        self.calls += 1
        self.threads.add(threading.get_ident())
        if self.failing > 0:
            self.failing -= 1
            if self.commit_first:
                super().publish_streams(member, **kw)
            raise StoreError("the database is unreachable")
        return super().publish_streams(member, **kw)


def test_a_store_error_is_retried_and_no_change_is_lost() -> None:
    clock = Clock()
    store = FlakyStore(clock)
    (d1, k1), (d2, k2) = enrolled(store, 2)
    a = Replica(store, "replica-a", clock)

    async def scenario() -> None:
        await a.start()
        kept = await a.open([(d1, k1)])
        gone = await a.open([(d2, k2)])
        store.failing, store.commit_first = 1, True  # both claims written, the answer lost
        assert await a.publisher.publish_once() == "failed"
        assert a.publisher.failures == 1
        a.registry.close(gone)  # closed before the store was reachable again
        store.failing, store.commit_first = 2, False
        assert await a.publisher.publish_once() == "failed"
        assert store.stream_owner(d2) is not None  # the row of the lost answer is still there
        assert await a.publisher.publish_once() == "failed"
        assert await a.publisher.publish_once() == "published" and a.publisher.failures == 0
        assert store.stream_owner(d1) == StreamOwner("replica-a", kept.sid, True)
        assert store.stream_owner(d2) is None  # released: its claim's outcome was unknown
        assert not a.publisher.pending.changed and a.lost == []

    run(scenario)


def test_the_loop_coalesces_changes_retries_with_backoff_and_never_blocks_the_event_loop() -> None:
    clock = Clock()
    store = FlakyStore(clock)
    devices = enrolled(store, 6)
    a = Replica(store, "replica-a", clock, publish_interval_s=0.4, resync_interval_s=30.0, max_backoff_s=0.4)

    async def scenario() -> None:
        await a.start()
        loop_thread = threading.get_ident()
        task = asyncio.create_task(a.publisher.run())
        await a.open(devices[:1])
        await eventually(lambda: store.calls == 1, "the first change published at once")
        for device in devices[1:]:  # five streams within one interval: one publish
            await a.open([device])
        await eventually(lambda: all(store.stream_owner(d) is not None for d, _ in devices), "all rows")
        assert store.calls == 2
        store.failing = 2
        sessions = list(a.registry.sessions.values())
        a.registry.close(sessions[0])
        await eventually(lambda: store.stream_owner(devices[0][0]) is None, "the release after two failures")
        assert store.calls == 5 and a.publisher.failures == 0
        assert loop_thread not in store.threads  # every store call ran on a worker thread
        a.publisher.stop()
        await asyncio.wait_for(task, 1.0)
        assert a.lost == []

    run(scenario)


@pytest.mark.parametrize("interval", [0.0, -1.0])
def test_a_publisher_refuses_a_non_positive_interval(interval: float) -> None:
    clock = Clock()
    store = InMemoryStore(lease_clock=clock)
    with pytest.raises(ValueError, match="publish_interval_s"):
        Replica(store, "replica-a", clock, publish_interval_s=interval)
