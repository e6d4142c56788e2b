"""A replica's membership of the tier (coordinator/membership.py): the
settings digest, and the keeper that joins, renews keeping the term's
token, and reports a term lost when it expired or another process of the
same name took the row; over the in-memory store, whose clock the test
moves (as the leader-lease tests do)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from coordinator.leadership import LeaseHeld
from coordinator.membership import LOCAL_SETTINGS, ROUND_SETTINGS, MembershipKeeper, settings_digest
from coordinator.settings import CoordinatorSettings
from coordinator.store import InMemoryStore, Lease

# ---------------------------------------------------------------- the digest


def settings(**overrides: Any) -> CoordinatorSettings:
    return CoordinatorSettings.load(overrides=overrides)


def test_equal_round_settings_give_one_digest_whatever_the_order_of_their_keys() -> None:
    a = settings(**{"model.hyperparameters": {"lr": 0.05, "dim": 16}, "cohort.size": 50})
    b = settings(**{"cohort.size": 50, "model.hyperparameters": {"dim": 16, "lr": 0.05}})
    assert settings_digest(a) == settings_digest(b)
    assert len(settings_digest(a)) == 64 and int(settings_digest(a), 16) >= 0  # hex sha256, fits the row


@pytest.mark.parametrize("change", [
    {"model.name": "fedmmf"},
    {"model.hyperparameters": {"lr": 0.06}},
    {"cohort.size": 99},
    {"deadlines.training": 301.0},
    {"secagg.group_size": 7},
    {"secagg.threshold": "majority"},
    {"secagg.modulus_bits": 24},
    {"dp.noise_multiplier": 1.5},
    {"dp.mode": "distributed"},
    {"round_metrics": False},
    {"debug.insecure_plaintext": True},
])
def test_any_round_relevant_change_changes_the_digest(change: dict[str, Any]) -> None:
    base = settings(**{"model.hyperparameters": {"lr": 0.05}})
    changed = settings(**{"model.hyperparameters": {"lr": 0.05}, **change})
    assert settings_digest(changed) != settings_digest(base)


@pytest.mark.parametrize("change", [
    {"listen_address": "127.0.0.1:60000"},
    {"replica.id": "replica-b"},
    {"replica.lease_s": 20.0},
    {"limits.max_streams": 7},
    {"metrics.listen": "127.0.0.1:9100"},
    {"heartbeat_interval": 3.0},
    {"database_url": "memory://"},
    {"seed": 5},
    {"debug.record_sums": True},
    {"rounds": 3},
])
def test_process_local_settings_leave_the_digest(change: dict[str, Any]) -> None:
    assert settings_digest(settings(**change)) == settings_digest(settings())


def test_every_setting_is_either_round_relevant_or_local() -> None:
    """A new setting must be placed in one of the two lists."""
    placed = set(ROUND_SETTINGS) | set(LOCAL_SETTINGS)
    assert not set(ROUND_SETTINGS) & set(LOCAL_SETTINGS)
    fields = set(CoordinatorSettings.model_fields) - {"debug"}
    debug = CoordinatorSettings.model_fields["debug"].annotation
    assert debug is not None
    fields |= {f"debug.{name}" for name in debug.model_fields}
    assert placed == fields


def test_the_device_ca_counts_by_content_not_path(tmp_path: Path) -> None:
    one, two, other = tmp_path / "a.pem", tmp_path / "b.pem", tmp_path / "c.pem"
    one.write_bytes(b"the same CA")
    two.write_bytes(b"the same CA")
    other.write_bytes(b"another CA")

    def with_ca(path: Path) -> str:
        return settings_digest(settings(**{"secagg.signatures": True, "secagg.device_ca": str(path)}))

    assert with_ca(one) == with_ca(two) != with_ca(other)
    assert with_ca(one) != settings_digest(settings(**{"secagg.signatures": True}))


# ---------------------------------------------------------------- the keeper


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class OneRenewalStore(InMemoryStore):
    """Sets `stop` after each join: one renewal per `keep()` call."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(lease_clock=clock)
        self.stop = threading.Event()
        self.joins: list[Lease | None] = []

    def join_tier(self, replica: str, seconds: float, **kw: Any) -> Lease | None:
        lease = super().join_tier(replica, seconds, **kw)
        self.joins.append(kw.get("renewing"))
        self.stop.set()
        return lease


DIGEST = "d" * 64


def keeper(store: InMemoryStore, clock: Clock, name: str = "replica-a") -> MembershipKeeper:
    return MembershipKeeper(store, name, 10.0, settings_digest=DIGEST, device_address="10.0.0.1:50051",
                            admin_address="10.0.0.1:50052", clock=clock)


def test_the_keeper_joins_renews_keeping_the_token_and_leaves() -> None:
    clock = Clock()
    store = OneRenewalStore(clock)
    a = keeper(store, clock)

    async def scenario() -> None:
        first = await a.join()
        assert (first.holder, first.token) == ("replica-a", 1) and a.member() == first
        [row] = store.live_replicas()
        assert (row.name, row.token, row.settings_digest, row.device_address, row.admin_address) == (
            "replica-a", 1, DIGEST, "10.0.0.1:50051", "10.0.0.1:50052")
        clock.now = 4.0  # past a third of the term: one renewal, naming the term it renews
        store.stop.clear()
        assert a.keep(store.stop) is None
        assert store.joins == [None, first] and a.member().token == 1
        [renewed] = store.live_replicas()
        assert renewed.token == 1 and renewed.expires_at == pytest.approx(14.0)
        await a.leave()
        assert store.live_replicas() == []
        assert (await a.join()).token == 2  # a new term after a leave

    asyncio.run(scenario())


def test_a_term_that_ran_out_is_lost_even_if_the_store_would_start_another() -> None:
    clock, own = Clock(), Clock()  # the store's clock; the replica's own (which runs slow)
    store = OneRenewalStore(clock)
    a = keeper(store, own)

    async def scenario() -> None:
        await a.join()
        clock.now = own.now = 20.0  # paused past its term: it counts itself out without asking
        assert (a.keep(threading.Event()) or "").startswith("no renewal reached the store")
        own.now = 4.0
        clock.now = 40.0  # its clock says the term runs; the store's says it expired
        store.stop.clear()
        assert a.keep(store.stop) == "the lease expired before it was renewed"
        assert store.live_replicas() == []  # the new term the renewal started was left at once
        assert a.member().token == 1  # the fence stays the lost term

    asyncio.run(scenario())


def test_a_term_taken_by_another_process_of_the_same_name_is_lost() -> None:
    clock, own = Clock(), Clock()
    store = OneRenewalStore(clock)
    a, successor = keeper(store, own), keeper(store, clock)

    async def scenario() -> None:
        await a.join()
        with pytest.raises(LeaseHeld, match="this replica's membership is held by term 1 of replica-a"):
            await successor.join(wait_s=0.0)  # a's term runs: a restarted process waits it out
        clock.now = 11.0
        assert (await successor.join()).token == 2
        own.now = 4.0  # a thinks its term still runs
        store.stop.clear()
        assert a.keep(store.stop) == "another process joined under this replica's name"
        [row] = store.live_replicas()
        assert row.token == 2  # the successor's term is untouched
        await a.leave()  # a lost term's leave changes nothing
        assert [r.token for r in store.live_replicas()] == [2]

    asyncio.run(scenario())

