"""The leader-lease rule (coordinator/leadership.py, D90) and the keeper over
an in-memory store whose clock the test moves."""

from __future__ import annotations

import asyncio
import threading

import pytest

from coordinator.leadership import SAFETY, LeaseHeld, LeaseKeeper, Term, lease_state
from coordinator.store import InMemoryStore, Lease
from edge_client.transport import TransportConfig, TransportConfigError


def test_the_holder_renews_after_a_third_and_counts_itself_deposed_before_the_expiry() -> None:
    term = Term(Lease("a", 1, 9.0), granted_at=100.0)
    assert lease_state(term, 100.0) == "wait"
    assert lease_state(term, 102.9) == "wait"
    assert lease_state(term, 103.0) == "renew"
    assert lease_state(term, 100.0 + SAFETY * 9.0 - 0.01) == "renew"
    assert lease_state(term, 100.0 + SAFETY * 9.0) == "lost"  # before the store's expiry at 109


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_standby_waits_and_a_second_process_on_a_one_process_store_gives_up() -> None:
    clock, a_clock = Clock(), Clock()  # the store's and b's clock; a's own (which runs slow)
    store = InMemoryStore(lease_clock=clock)
    a = LeaseKeeper(store, "a", 10.0, clock=a_clock)
    b = LeaseKeeper(store, "b", 10.0, clock=clock)

    async def scenario() -> None:
        first = await a.acquire()
        assert first.token == 1 and a.fence() == first
        with pytest.raises(LeaseHeld, match="held by a"):
            await b.acquire(wait_s=0.0)
        waiting = asyncio.create_task(b.acquire(poll_s=0.01))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # a standby while a's lease runs
        clock.now = 11.0  # a never renewed: its lease expired
        second = await asyncio.wait_for(waiting, 5.0)
        assert second.token == 2 and b.fence().holder == "b"
        a_clock.now = 4.0  # a thinks its lease still runs: its renewal finds b's
        assert a.keep(threading.Event()) == "another replica holds the lease"

    asyncio.run(scenario())


def test_a_replica_whose_lease_lapsed_steps_down_even_if_nobody_took_it() -> None:
    clock = Clock()
    store = InMemoryStore(lease_clock=clock)
    a = LeaseKeeper(store, "a", 10.0, clock=clock)

    async def scenario() -> None:
        await a.acquire()
        clock.now = 20.0  # paused past its lease
        assert (a.keep(threading.Event()) or "").startswith("no renewal reached the store")
        assert a.fence().token == 1  # its writes stay fenced with the old term

    asyncio.run(scenario())


class LeaselessStore(InMemoryStore):
    """A store whose own leader lease must not be touched."""

    def acquire_lease(self, holder: str, seconds: float) -> Lease | None:
        raise AssertionError("the store's lease was asked for")

    def release_lease(self, lease: Lease) -> None:
        raise AssertionError("the store's lease was released")


def test_a_keeper_given_its_own_lease_calls_keeps_that_lease_by_the_same_rule() -> None:
    """Injected acquire / release callables (here another store's lease row,
    as a replica's own row would be) replace the store's lease methods in
    every path: the first grant, a renewal, a loss to another holder and the
    release; the store's own lease is never asked for."""
    clock, a_clock = Clock(), Clock()  # the row's (and b's) clock; a's own
    row = InMemoryStore(lease_clock=clock)
    asked: list[tuple[str, str]] = []
    stop = threading.Event()

    def acquire(holder: str, seconds: float) -> Lease | None:
        asked.append(("acquire", holder))
        lease = row.acquire_lease(holder, seconds)
        stop.set()  # one renewal per keep() below
        return lease

    def release(lease: Lease) -> None:
        asked.append(("release", lease.holder))
        row.release_lease(lease)

    store = LeaselessStore()
    a = LeaseKeeper(store, "a", 10.0, clock=a_clock, acquire_lease=acquire, release_lease=release)

    async def scenario() -> None:
        first = await a.acquire()
        assert (first.holder, first.token) == ("a", 1) and a.fence() == first
        held = row.current_lease()
        assert held is not None and held.holder == "a"
        assert store.current_lease() is None  # the store's own lease stays free

        clock.now = a_clock.now = 4.0  # past a third of the lease: a renews through `acquire`, same term
        stop.clear()
        assert a.keep(stop) is None
        assert asked == [("acquire", "a"), ("acquire", "a")] and a.fence().token == 1
        renewed = row.current_lease()
        assert renewed is not None and renewed.remaining_s == pytest.approx(10.0)

        await a.release()
        assert asked[-1] == ("release", "a") and row.current_lease() is None

        clock.now = a_clock.now = 20.0
        again = await a.acquire()  # a new term in the row
        assert again.token == 2
        clock.now = 31.0  # a's term ran out in the row; b takes it
        taken = row.acquire_lease("b", 10.0)
        assert taken is not None and taken.token == 3
        a_clock.now = 24.0  # a thinks its lease still runs: its renewal finds b's
        stop.clear()
        assert a.keep(stop) == "another replica holds the lease"

    asyncio.run(scenario())


def test_clients_take_a_list_of_replica_addresses_and_try_them_in_turn() -> None:
    cfg = TransportConfig(target="10.0.0.1:50051, coordinator-b:50051")
    assert cfg.targets == ("10.0.0.1:50051", "coordinator-b:50051")
    assert [cfg.for_attempt(i) for i in range(3)] == ["10.0.0.1:50051", "coordinator-b:50051", "10.0.0.1:50051"]
    with pytest.raises(TransportConfigError, match="HOST:PORT"):
        TransportConfig(target="10.0.0.1:50051,nope")


def test_the_keeper_renews_on_its_own_thread_while_the_event_loop_is_busy() -> None:
    """A start-up that blocks the event loop longer than the lease (loading a
    model) must not cost the lease: renewals run on the keeper's thread."""
    store = InMemoryStore()
    keeper = LeaseKeeper(store, "a", 1.0)
    lost: list[str] = []

    async def scenario() -> None:
        await keeper.acquire()
        halt = keeper.keep_in_background(lost.append)
        try:
            import time
            time.sleep(2.5)  # the loop blocked for 2.5 leases
            held = store.current_lease()
            assert held is not None and held.holder == "a" and held.token == 1
        finally:
            halt()

    asyncio.run(scenario())
    assert lost == []


class SilentStore(InMemoryStore):
    """An in-memory store whose lease renewals, once `silence` is set, wait
    until `answer` is set: a network that drops packets, then heals."""

    def __init__(self) -> None:
        super().__init__()
        self.silence, self.answer = threading.Event(), threading.Event()
        self.released: list[Lease] = []

    def acquire_lease(self, holder: str, seconds: float) -> Lease | None:
        if self.silence.is_set():
            self.answer.wait(30.0)
        return super().acquire_lease(holder, seconds)

    def release_lease(self, lease: Lease) -> None:
        super().release_lease(lease)
        self.released.append(lease)


def test_a_renewal_the_store_never_answers_costs_the_lease_at_the_safety_margin() -> None:
    """A cut network that drops packets gives no error: the renewal would
    wait on TCP timeouts. The keeper stops waiting at `lost_after` and steps
    down before the store's expiry; an answer that lands later is released,
    so a standby does not wait out a term nobody leads."""
    import time

    store = SilentStore()
    keeper = LeaseKeeper(store, "a", 1.0)
    lost: list[tuple[str, float]] = []

    async def scenario() -> None:
        await keeper.acquire()
        store.silence.set()
        silenced = time.monotonic()
        halt = keeper.keep_in_background(lambda why: lost.append((why, time.monotonic() - silenced)))
        try:
            await asyncio.sleep(SAFETY * 1.0 + 0.5)
            assert len(lost) == 1 and lost[0][0].startswith("no renewal reached the store"), lost
            assert lost[0][1] < SAFETY * 1.0 + 0.1  # stepped down before the lease ran out in the store
        finally:
            halt()

    asyncio.run(scenario())
    store.answer.set()  # the network heals: the late renewal lands (a new term) and is given back at once
    deadline = time.monotonic() + 5.0
    while not store.released and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [(r.holder, r.token) for r in store.released] == [("a", 2)]
    taken = asyncio.run(LeaseKeeper(store, "b", 1.0).acquire(wait_s=0.0))  # no term left to wait out
    assert (taken.holder, taken.token) == ("b", 3)


def test_a_deposed_leader_whose_shutdown_hangs_exits_anyway() -> None:
    """`exit_if_stuck`: a daemon timer that ends the process with
    EXIT_DEPOSED once its time is up (a store call blocked on a silent
    network can hold a shutdown for minutes), and does nothing if cancelled
    by a shutdown that ended first."""
    import threading

    from coordinator.server import EXIT_DEPOSED, exit_if_stuck

    codes: list[int] = []
    done = threading.Event()

    def fake_exit(code: int) -> None:
        codes.append(code)
        done.set()

    timer = exit_if_stuck(0.05, exit=fake_exit)
    assert timer.daemon
    assert done.wait(5.0) and codes == [EXIT_DEPOSED]
    quiet = exit_if_stuck(0.2, exit=fake_exit)
    quiet.cancel()
    quiet.join(1.0)
    assert codes == [EXIT_DEPOSED]
