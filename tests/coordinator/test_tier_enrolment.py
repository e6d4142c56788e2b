"""Enrolment across the replica tier (D109): a coordinator whose store
serves replicas (a PostgreSQL `database_url`) MACs its enrolment challenges
under the store's tier secret, so a device that asked one replica for a
challenge enrols through another; a coordinator on a store of its own
keeps its per-process challenges. The shared InMemoryStore stands for the
shared database (its `tier_secret` is the database's)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from coordinator.errors import ProtocolViolation
from coordinator.model_host import build_server_model
from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from coordinator.store import InMemoryStore
from coordinator_fakes import identity_private, signed_enroll_request

POSTGRESQL = "postgresql+psycopg://fedmask@db.invalid:5432/fedmask"


def coordinator(store: InMemoryStore, database_url: str, wall: Callable[[], datetime] | None = None) -> Coordinator:
    s = CoordinatorSettings.load(overrides={
        "listen_address": "127.0.0.1:0", "database_url": database_url, "model.name": "synthetic",
        "model.hyperparameters": {"vector_length": 8}, "dp.mode": "none", "seed": 3, "rounds": 1})
    extra: dict[str, Any] = {} if wall is None else {"wall_clock": wall}
    return Coordinator(s, store=store, model=build_server_model(s.model.name, s.model.hyperparameters), **extra)


def test_a_challenge_of_one_replica_enrols_through_another() -> None:
    async def main() -> None:
        shared, own = InMemoryStore(), InMemoryStore()
        a, b = coordinator(shared, POSTGRESQL), coordinator(shared, POSTGRESQL)
        other_tier, alone = coordinator(own, POSTGRESQL), coordinator(shared, "memory://")
        for c in (a, b, other_tier, alone):
            await c.start()
        try:
            assert a.registry.challenges.tier and not alone.registry.challenges.tier
            challenge = a.enroll_challenge().challenge
            keys = [identity_private(i) for i in range(2)]
            response = await b.enroll(signed_enroll_request(challenge, keys), client_id=None)
            assert len(response.devices) == 2 and {d.device_id for d in response.devices} == {
                r.id for r in shared.list_devices()}
            for refusing in (other_tier, alone):  # another tier's secret; a per-process one
                with pytest.raises(ProtocolViolation, match="not issued by this coordinator"):
                    await refusing.enroll(signed_enroll_request(challenge, [identity_private(5)]), client_id=None)
        finally:
            for c in (a, b, other_tier, alone):
                await c.shutdown()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_tier_challenge_expires_on_the_coordinators_wall_clock() -> None:
    async def main() -> None:
        shared = InMemoryStore()
        now = [datetime(2020, 1, 1, tzinfo=UTC)]
        a, b = coordinator(shared, POSTGRESQL), coordinator(shared, POSTGRESQL, wall=lambda: now[0])
        await a.start()
        await b.start()
        try:
            challenge = b.enroll_challenge().challenge
            c = b.registry.challenges
            now[0] += timedelta(seconds=c.ttl_s + c.skew_s + 1)
            with pytest.raises(ProtocolViolation, match="expired"):
                await b.enroll(signed_enroll_request(challenge, [identity_private(1)]), client_id=None)
            # a replica on the real wall clock (today, years after 2020-01-01) refuses it as well
            with pytest.raises(ProtocolViolation, match="expired"):
                await a.enroll(signed_enroll_request(challenge, [identity_private(1)]), client_id=None)
        finally:
            await a.shutdown()
            await b.shutdown()

    asyncio.run(asyncio.wait_for(main(), 60))
