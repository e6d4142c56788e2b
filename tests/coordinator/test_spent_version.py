"""A coordinator that dies after asking for unmasking must not hold the
federation (D94): the round's record lists who was asked before anyone is
asked (coordinator/unmasking_guard.py), and a successor moves past a
version such a round spent (coordinator/version_skip.py). The kill itself,
over real processes on PostgreSQL: tests/integration/test_replica_spent_version.py."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest
from grpc_health.v1.health import aio as health_aio

from coordinator.current_model import CurrentModel
from coordinator.model_host import build_server_model
from coordinator.server import build_server, set_serving
from coordinator.service import Coordinator
from coordinator.settings import CoordinatorSettings
from coordinator.spent_devices import SpentDevices, left_by_a_dead_coordinator
from coordinator.store import COORDINATOR_RESTART, FencedOut, InMemoryStore, RoundRecord, RoundState, StoreError
from coordinator.unmasking_guard import UNMASKING_REQUEST
from coordinator.version_skip import SKIP_OF, SKIPPED_ROUNDS, VersionSkip, should_skip, skip_version

from coordinator_fakes import FakeClient, FakeDevice, enroll

T0 = datetime(2026, 1, 1, tzinfo=UTC)
L = 16


def settings(**over: Any) -> CoordinatorSettings:
    base = {
        "listen_address": "127.0.0.1:0", "database_url": "memory://", "model.name": "synthetic",
        "model.hyperparameters": {"vector_length": L}, "cohort.size": 4, "cohort.minimum": 3,
        "cohort.over_selection": 0.0, "cohort.allow_consecutive": True, "deadlines.selection": 0.3,
        **{f"deadlines.{k}": 5.0 for k in ("training", "advertise_keys", "share_keys", "share_check", "masked_input",
                                            "consistency_check", "unmasking")},
        "dp.mode": "none", "secagg.graph": "full", "secagg.threshold": "majority", "seed": 3, "rounds": 1,
    }
    return CoordinatorSettings.load(overrides={**base, **over})


class Journal(InMemoryStore):
    """Writes the round's progress in `journal` (and fails the unmasking save when told)."""

    def __init__(self, fail_unmasking: bool = False, successor: bool = False) -> None:
        super().__init__()
        self.journal: list[tuple[str, Any]] = []
        self.fail_unmasking = fail_unmasking
        self.successor = successor  # a successor aborts the round just before the unmasking save

    def save_round_progress(self, record: RoundRecord) -> None:
        if record.state is RoundState.UNMASKING and self.fail_unmasking:
            raise StoreError("database went away")
        if record.state is RoundState.UNMASKING and self.successor:
            self.mark_interrupted_rounds_aborted()
        super().save_round_progress(record)
        self.journal.append(("saved", (record.state, frozenset(record.survivors.get("masked_input", ())))))


@contextlib.asynccontextmanager
async def running(store: Journal) -> AsyncIterator[tuple[Coordinator, str, asyncio.Task[None]]]:
    s = settings()
    coord = Coordinator(s, store=store, model=build_server_model(s.model.name, s.model.hyperparameters))
    sent, told = coord.delivery.send, coord.delivery.broadcast

    def send(device_id: int, message: Any) -> None:
        if message.WhichOneof("message") == UNMASKING_REQUEST:
            store.journal.append(("asked", device_id))
        sent(device_id, message)

    def broadcast(device_ids: Any, message: Any) -> None:
        if message.WhichOneof("message") == UNMASKING_REQUEST:
            store.journal.extend(("asked", d) for d in device_ids)
        told(device_ids, message)

    setattr(coord.delivery, "send", send)
    setattr(coord.delivery, "broadcast", broadcast)
    await coord.start()
    health = health_aio.HealthServicer()
    server, port = await build_server(coord, s, health)
    await server.start()
    await set_serving(health, True)
    rounds = asyncio.create_task(coord.run())
    try:
        yield coord, f"127.0.0.1:{port}", rounds
    finally:
        await coord.shutdown("test over")
        with contextlib.suppress(Exception):
            await asyncio.wait_for(rounds, 10)
        await server.stop(0.5)


async def _round(store: Journal) -> None:
    async with running(store) as (coord, target, rounds):
        devices = [FakeDevice(d, seed=7, identity_key=k) for d, k in await enroll(target, 4)]
        clients = [FakeClient(target, devices[g::2], name=f"client-{g}") for g in range(2)]
        for c in clients:
            await c.start()
        await asyncio.wait_for(asyncio.shield(rounds), 20)
        for c in clients:
            await c.close()


def test_who_is_asked_to_unmask_is_saved_before_anyone_is_asked() -> None:
    store = Journal()
    asyncio.run(_round(store))
    asked = [i for i, (what, _) in enumerate(store.journal) if what == "asked"]
    assert asked, store.journal
    saved = [i for i, (what, v) in enumerate(store.journal) if what == "saved" and v[0] is RoundState.UNMASKING]
    assert saved and saved[0] < asked[0], store.journal
    _, (_, listed) = store.journal[saved[0]]
    assert {d for what, d in store.journal if what == "asked"} <= listed  # every device asked is listed
    r = store.get_round(1)
    assert r is not None and r.state is RoundState.COMMITTED


def test_no_device_is_asked_when_the_record_cannot_be_saved() -> None:
    store = Journal(fail_unmasking=True)
    asyncio.run(_round(store))
    assert not [e for e in store.journal if e[0] == "asked"], store.journal
    r = store.get_round(1)
    assert r is not None and r.state is RoundState.ABORTED and r.abort_reason == "cancelled" and not r.survivors.get("unmasking")


def test_a_leader_whose_round_a_successor_aborted_asks_nobody() -> None:
    """A paused leader wakes mid-round after a successor took over and
    aborted its round: the store refuses the save, so no device is asked."""
    store = Journal(successor=True)
    asyncio.run(_round(store))
    assert not [e for e in store.journal if e[0] == "asked"], store.journal
    r = store.get_round(1)
    assert r is not None and r.state is RoundState.ABORTED and r.abort_reason == COORDINATOR_RESTART


def _record(number: int, state: RoundState, base: int, reason: str | None, **survivors: list[int]) -> RoundRecord:
    return RoundRecord(number=number, state=state, started_at=T0, ended_at=T0 if state.is_terminal else None,
                       cohort_size=6, abort_reason=reason, base_model_version=base,
                       survivors={"selected": [1, 2, 3, 4, 5, 6], **survivors})


def test_only_rounds_a_dead_coordinator_left_count_as_interrupted() -> None:
    asked = [1, 2, 3, 4, 5]
    rounds = [
        _record(1, RoundState.ABORTED, 1, COORDINATOR_RESTART, masked_input=asked),  # died after asking
        _record(2, RoundState.ABORTED, 1, COORDINATOR_RESTART, advertise_keys=asked),  # died before asking
        _record(3, RoundState.ABORTED, 1, "too_few_survivors", masked_input=asked, unmasking=[1, 2]),  # a live abort
        _record(4, RoundState.UNMASKING, 1, None, masked_input=[6]),  # in progress, nobody to finish it
    ]
    assert left_by_a_dead_coordinator(rounds) == {1: frozenset(asked), 4: frozenset({6})}


class _Spent(SpentDevices):
    def __init__(self, version: int, interrupted: dict[int, frozenset[int]]) -> None:
        super().__init__(InMemoryStore())
        self._version, self.interrupted = version, interrupted


def test_a_skip_only_when_the_dead_coordinators_devices_block_selection() -> None:
    spent = _Spent(1, {7: frozenset({1, 2, 3})})
    assert should_skip(spent, [1, 2, 3, 9], eligible=1, minimum=3)
    assert not should_skip(spent, [1, 2, 3, 9], eligible=3, minimum=3)  # a cohort forms without them
    assert not should_skip(spent, [1, 9], eligible=1, minimum=3)  # not enough even with them: wait
    assert not should_skip(_Spent(1, {}), [1, 2, 3], eligible=0, minimum=3)  # a live abort: D85's wait


def _current(store: InMemoryStore) -> tuple[CurrentModel, Any]:
    model = build_server_model("synthetic", {"vector_length": L})
    current = CurrentModel(store, model)
    asyncio.run(current.load(0))
    return current, model


def test_the_skip_version_has_the_same_parameters_at_the_next_step_and_is_fenced() -> None:
    store = InMemoryStore()
    current, model = _current(store)
    v0, before = current.version, dict(current.parameters)
    assert v0 is not None
    spent = _Spent(v0, {7: frozenset({1, 2, 3})})
    lease = store.acquire_lease("a", 30)
    assert lease is not None
    store.fence_writes(lambda: lease)
    v1 = asyncio.run(skip_version(store, current, model, spent))
    assert v1 is not None and current.version == v1 and current.step == 1
    stored = store.get_model_version(v1)
    assert stored.round_number is None and stored.hyperparameters["step"] == 1
    assert stored.hyperparameters[SKIP_OF] == v0 and stored.hyperparameters[SKIPPED_ROUNDS] == [7]
    assert all(np.array_equal(before[k], current.parameters[k]) for k in before)
    assert asyncio.run(skip_version(store, current, model, spent)) is None  # the version moved on already

    store.fence_writes(lambda: dataclasses.replace(lease, holder="b"))  # not the term that leads
    with pytest.raises(FencedOut):
        asyncio.run(skip_version(store, current, model, _Spent(v1, {8: frozenset({1})})))
    latest = store.latest_model_version("synthetic")
    assert current.version == v1 and latest is not None and latest.id == v1


def test_the_loop_skips_only_after_a_selection_window_of_being_blocked() -> None:
    store = InMemoryStore()
    current, model = _current(store)
    assert current.version is not None
    now = [0.0]
    skip = VersionSkip(store, current, model, grace_s=3.0, clock=lambda: now[0])
    spent = _Spent(current.version, {7: frozenset({1, 2, 3})})

    def step(available: list[int], eligible: int) -> bool:
        return asyncio.run(skip.step(spent, available, eligible=eligible, minimum=3))

    assert not step([1, 2, 3], 0)  # blocked since 0
    now[0] = 2.0
    assert not step([1, 2, 3, 4, 5, 6], 3)  # devices came back: a cohort forms, the clock restarts
    assert not step([1, 2, 3], 0)
    now[0] = 4.9
    assert not step([1, 2, 3], 0)
    now[0] = 5.0
    assert step([1, 2, 3], 0) and current.step == 1  # blocked a whole window
