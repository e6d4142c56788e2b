"""The devices the honest coordinator leaves out because they already answered
an unmasking request on the current model version (coordinator/spent_devices.py, D85)."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

import pytest

from coordinator.spent_devices import (
    SpentDevices,
    read_spent,
    rollback_chain,
    same_training_versions,
    spent_devices,
    unmasking_responders,
)
from coordinator.store import COORDINATOR_RESTART, InMemoryStore, NewModelVersion, RoundRecord, RoundState

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def record(number: int, state: RoundState, base: int | None, survivors: dict[str, list[int]],
           reason: str | None = None) -> RoundRecord:
    if state is RoundState.ABORTED and reason is None:
        reason = "too_few_survivors"
    return RoundRecord(number=number, state=state, started_at=T0, ended_at=T0 if state.is_terminal else None,
                       cohort_size=6, abort_reason=reason, base_model_version=base,
                       survivors={"selected": [1, 2, 3, 4, 5, 6], **survivors})


def test_responders_of_closed_and_interrupted_rounds() -> None:
    passive = {"masked_input": [1, 2, 3, 4, 5]}
    # aborted at unmasking (or cancelled during it): who answered, as recorded
    assert unmasking_responders(record(1, RoundState.ABORTED, 1, {**passive, "unmasking": [1, 2]})) == {1, 2}
    assert unmasking_responders(record(1, RoundState.COMMITTED, 1, {**passive, "unmasking": [1, 2, 3]})) == {1, 2, 3}
    # aborted before unmasking: nobody answered
    assert unmasking_responders(record(1, RoundState.ABORTED, 1, passive)) == frozenset()
    # a crash may have come before the answers were saved: every device asked counts
    crashed = record(1, RoundState.ABORTED, 1, {**passive, "unmasking": [1]}, reason=COORDINATOR_RESTART)
    assert unmasking_responders(crashed) == {1, 2, 3, 4, 5}
    active = {"masked_input": [1, 2, 3, 4, 5], "consistency_check": [1, 2, 3]}
    assert unmasking_responders(record(1, RoundState.UNMASKING, 1, active)) == {1, 2, 3}
    assert unmasking_responders(record(1, RoundState.MASKED_INPUT, 1, {"share_keys": [1, 2, 3]})) == frozenset()


def test_only_rounds_on_the_versions_that_train_the_same_count() -> None:
    rounds = [
        record(1, RoundState.COMMITTED, 1, {"unmasking": [1, 2, 3]}),   # produced version 2
        record(2, RoundState.ABORTED, 2, {"unmasking": [4, 5]}),
        record(3, RoundState.ABORTED, 2, {"unmasking": [6]}),
        record(4, RoundState.ABORTED, None, {}, reason="not_enough_devices"),
    ]
    assert spent_devices(rounds, {2}) == {4, 5, 6}
    assert spent_devices(rounds, {2, 1}) == {1, 2, 3, 4, 5, 6}  # version 2 is a rollback to version 1
    assert spent_devices(rounds, {3}) == frozenset()


def test_rollback_chains_end_and_never_loop() -> None:
    parents = {5: 3, 3: 1, 1: None, 7: 8, 8: 7}
    assert same_training_versions(5, parents.get) == {5, 3, 1}
    assert same_training_versions(7, parents.get) == {7, 8}
    assert same_training_versions(9, parents.get) == {9}


def test_read_from_the_store_across_pages() -> None:
    store = InMemoryStore()
    v1 = store.add_model_version(NewModelVersion(model_name="m", parameters=b"p", hyperparameters={"step": 0})).id
    v2 = store.add_model_version(NewModelVersion(model_name="m", parameters=b"q", hyperparameters={"step": 1})).id
    back = store.add_model_version(NewModelVersion(model_name="m", parameters=b"p",
                                                   hyperparameters={"step": 0, "rollback_of": v1})).id
    n = store.next_round_number()
    store.abort_round(record(n, RoundState.ABORTED, v1, {"unmasking": [1, 2]}))
    for _ in range(450):  # more than two pages of rounds on version 2
        n = store.next_round_number()
        store.abort_round(record(n, RoundState.ABORTED, v2, {"unmasking": [3]}))
    assert read_spent(store, {v2}) == {3}
    assert rollback_chain(store, back) == {back, v1}
    assert read_spent(store, rollback_chain(store, back)) == {1, 2}


def test_waiting_is_said_once_per_version_and_count(caplog: pytest.LogCaptureFixture) -> None:
    store = InMemoryStore()
    v = store.add_model_version(NewModelVersion(model_name="m", parameters=b"p", hyperparameters={})).id
    n = store.next_round_number()
    store.abort_round(record(n, RoundState.ABORTED, v, {"unmasking": [1, 2, 3]}))
    spent = SpentDevices(store)
    asyncio.run(spent.refresh(v))
    assert spent.devices == {1, 2, 3}
    with caplog.at_level(logging.INFO, logger="fedmask"):
        for _ in range(3):
            spent.waiting([1, 2, 3, 4], eligible=1, minimum=4)
        spent.waiting([1, 2, 4], eligible=1, minimum=4)  # one spent device left: the count changed
        spent.waiting([4, 5, 6, 7], eligible=4, minimum=5)  # none spent among the available: nothing to say
    lines = [r.getMessage() for r in caplog.records if "selection_waiting" in r.getMessage()]
    assert len(lines) == 2 and "spent=3" in lines[0] and "spent=2" in lines[1], lines
    asyncio.run(spent.refresh(None))
    assert spent.devices == frozenset()
