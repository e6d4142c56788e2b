"""LeaderElection (coordinator/election.py, D109): a replica that keeps
serving leads while it holds the leader lease and is a candidate again when
it loses it; over an in-memory store whose lease clock the test moves."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from coordinator.election import STOPPED, LeaderElection
from coordinator.leadership import LeaseKeeper
from coordinator.store import InMemoryStore, Lease, StoreError

LEASE_S = 0.3  # the keeper's thread looks at the (frozen) clock every 0.1 s of real time


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Host:
    """What a replica does on leading and on being deposed: recorded."""

    def __init__(self, *, fail_first_lead: bool = False) -> None:
        self.led: list[Lease] = []
        self.deposed: list[str] = []
        self._fail = fail_first_lead

    async def on_lead(self, lease: Lease) -> None:
        self.led.append(lease)
        if self._fail:
            self._fail = False
            raise RuntimeError("recovery failed")

    async def on_depose(self, reason: str) -> None:
        self.deposed.append(reason)


def election(store: InMemoryStore, clock: Clock, name: str, host: Host) -> LeaderElection:
    keeper = LeaseKeeper(store, name, LEASE_S, clock=clock)
    return LeaderElection(keeper, on_lead=host.on_lead, on_depose=host.on_depose, poll_s=0.01)


async def until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    async def poll() -> None:
        while not check():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout)


def test_a_candidate_leads_and_stop_releases_the_lease() -> None:
    async def main() -> None:
        clock = Clock()
        store = InMemoryStore(lease_clock=clock)
        host = Host()
        a = election(store, clock, "a", host)
        task = a.start()
        await until(lambda: a.leading is not None)
        assert [lease.holder for lease in host.led] == ["a"] and a.terms == 1
        held = store.current_lease()
        assert held is not None and held.holder == "a" and held.token == host.led[0].token
        await a.stop()
        assert task.done() and a.leading is None
        assert host.deposed == [STOPPED]  # deposed while the lease was still held, then released
        assert store.current_lease() is None

    asyncio.run(main())


def test_a_leader_that_loses_the_lease_is_a_candidate_again_and_re_leads() -> None:
    async def main() -> None:
        clock = Clock()
        store = InMemoryStore(lease_clock=clock)
        host = Host()
        a = election(store, clock, "a", host)
        task = a.start()
        await until(lambda: a.leading is not None)
        clock.now = 1.0  # a's term expired without a renewal; another holder takes the lease
        other = store.acquire_lease("b", LEASE_S)
        assert other is not None and other.token == 2
        await until(lambda: host.deposed != [])
        assert host.deposed[0].startswith("no renewal reached the store")
        assert a.leading is None and not task.done()  # a candidate, still running
        await asyncio.sleep(0.1)
        assert len(host.led) == 1  # b's lease runs (the clock is frozen): a waits
        store.release_lease(other)
        await until(lambda: a.leading is not None)
        assert [lease.token for lease in host.led] == [1, 3] and a.terms == 2
        held = store.current_lease()
        assert held is not None and held.holder == "a" and held.token == 3
        await a.stop()
        assert host.deposed[1:] == [STOPPED] and store.current_lease() is None

    asyncio.run(main())


def test_two_candidates_exactly_one_leads_and_the_other_takes_over_when_it_stops() -> None:
    async def main() -> None:
        clock = Clock()
        store = InMemoryStore(lease_clock=clock)
        hosts = {"a": Host(), "b": Host()}
        elections = {name: election(store, clock, name, host) for name, host in hosts.items()}
        for e in elections.values():
            e.start()
        await until(lambda: any(e.leading is not None for e in elections.values()))
        await asyncio.sleep(0.1)
        leaders = [name for name, e in elections.items() if e.leading is not None]
        assert len(leaders) == 1
        first = leaders[0]
        second = "b" if first == "a" else "a"
        await elections[first].stop()
        await until(lambda: elections[second].leading is not None)
        assert hosts[second].led[0].token == 2 and not hosts[second].deposed
        await elections[second].stop()

    asyncio.run(main())


def test_a_failed_start_of_leading_gives_the_lease_up_and_tries_again() -> None:
    async def main() -> None:
        clock = Clock()
        store = InMemoryStore(lease_clock=clock)
        host = Host(fail_first_lead=True)
        a = election(store, clock, "a", host)
        a.start()
        await until(lambda: len(host.led) == 2)
        assert host.deposed[0] == "leading failed: RuntimeError: recovery failed"
        assert [lease.token for lease in host.led] == [1, 2]  # released, then a new term
        await a.stop()
        assert store.current_lease() is None

    asyncio.run(main())


def test_stopping_a_candidate_ends_its_polling_without_touching_the_lease() -> None:
    async def main() -> None:
        clock = Clock()
        store = InMemoryStore(lease_clock=clock)
        other = store.acquire_lease("b", LEASE_S)
        assert other is not None
        host = Host()
        a = election(store, clock, "a", host)
        task = a.start()
        await asyncio.sleep(0.05)
        await a.stop()
        assert task.done() and host.led == [] and host.deposed == []
        held = store.current_lease()
        assert held is not None and held.holder == "b"

    asyncio.run(main())


class FlakyStore(InMemoryStore):
    """An in-memory store whose first `failures` lease requests fail as a database that cannot be reached."""

    def __init__(self, failures: int, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.failures = failures
        self.asked = 0

    def acquire_lease(self, holder: str, lease_s: float) -> Lease | None:
        self.asked += 1
        if self.asked <= self.failures:
            raise StoreError("database error: connection refused")
        return super().acquire_lease(holder, lease_s)


def test_a_candidate_whose_store_fails_keeps_polling_and_then_leads() -> None:
    async def main() -> None:
        clock = Clock()
        store = FlakyStore(3, lease_clock=clock)
        host = Host()
        a = election(store, clock, "a", host)
        task = a.start()
        await until(lambda: a.leading is not None)
        assert store.asked == 4 and not task.done()  # three failed polls, then the grant
        assert [lease.holder for lease in host.led] == ["a"]
        await a.stop()
        assert task.exception() is None  # stop() raises nothing: the errors never ended the loop

    asyncio.run(main())


def test_stopping_a_candidate_whose_store_keeps_failing_raises_nothing() -> None:
    async def main() -> None:
        clock = Clock()
        store = FlakyStore(10**9, lease_clock=clock)
        a = election(store, clock, "a", Host())
        task = a.start()
        await until(lambda: store.asked >= 3)
        await a.stop()
        assert task.done() and task.exception() is None and a.terms == 0

    asyncio.run(main())
