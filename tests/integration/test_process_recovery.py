"""Crash recovery with real processes on 127.0.0.1.

1. The coordinator is SIGKILLed in the middle of a round (a device went
   silent at masked-input and the stage waits for it) and restarted on the
   same database (SQLite and PostgreSQL); an edge client is SIGKILLed at the
   same time and restarted on the same --state-dir. Training resumes from the
   last committed version: the interrupted round is aborted with
   'coordinator_restart', the next round commits on top of the last committed
   version, versions stay monotonic and every blob verifies against its
   sha256; the killed client declines the interrupted round (its round
   secrets are wiped) and its devices take part in the next one.
2. An edge client training FedRAP exits abruptly after its first round
   (`--crash-after-round 1`, os._exit) and is restarted on the same
   --state-dir: the private state on disk is the one written in its last
   round, the restart keeps it, and the next round trains on from it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from edge_client.faults import CRASH_EXIT_CODE, FaultPlan
from edge_client.state import read_arrays
from integration_harness import (
    Processes,
    all_rounds,
    check_exact_aggregate,
    client_args,
    coordinator_args,
    free_port,
    open_store_readonly,
    terminal_rounds,
    wait_serving,
    wait_until,
)

pytestmark = [pytest.mark.slow]

N = 10
T = N // 2 + 1
L = 32


def _seed_for_stall(rate: float) -> int:
    """Round 1: nobody drops; round 2: someone goes silent at masked-input
    (the round stalls there); round 3: at most n - t drop (it can commit)."""
    for seed in range(10_000):
        plan = FaultPlan(drop_rate=rate, drop_stage="masked-input", seed=seed)
        drops = [sum(plan.drop_stage_of(d, r) is not None for d in range(1, N + 1)) for r in (1, 2, 3)]
        if drops[0] == 0 and 1 <= drops[1] and drops[2] <= N - T:
            return seed
    raise AssertionError("no seed")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("database_url", ["sqlite", "postgresql"], indirect=True)
def test_coordinator_sigkill_mid_round_then_restart_resumes(procs: Processes, tmp_path: Path, database_url: str) -> None:
    from coordinator.store.records import sha256_hex

    seed = _seed_for_stall(0.2)
    port = free_port()
    common = dict(
        model="synthetic", model_params={"vector_length": L}, cohort_size=N, cohort_minimum=N,
        over_selection=0.0, allow_consecutive=True, seed=1, selection_deadline=60,
        training_deadline=2, advertise_keys_deadline=5, share_keys_deadline=5, unmasking_deadline=5,
        secagg_graph="full", secagg_threshold="majority", dp_mode="none", debug_record_sums=True,
    )
    # masked-input deadline of 10 minutes: round 2 stalls there (a device is silent)
    coord = procs.start("coordinator", coordinator_args(port, database_url, masked_input_deadline=600, **common))
    wait_serving(port, coord)
    dirs = [tmp_path / "client-a", tmp_path / "client-b"]
    cflags = dict(dataset="synthetic", seed=seed, drop_rate=0.2, drop_stage="masked-input", debug_record_inputs=True,
                  threads=1)
    a = procs.start("client-a", client_args(port, "1-5", dirs[0], **cflags))
    b = procs.start("client-b", client_args(port, "6-10", dirs[1], **cflags))

    def stalled() -> bool:
        rounds = all_rounds(database_url)
        return (len(rounds) >= 2 and rounds[0].state.value == "committed"
                and rounds[1].state.value == "masked_input")

    wait_until(stalled, 90, what="round 2 to wait in masked_input", watch=[coord, a, b], step=0.2)
    wait_until(lambda: list(dirs[1].glob("devices/*/round.fms")) or list(dirs[0].glob("devices/*/round.fms")), 10,
               what="a device waiting for unmasking (round secret on disk)")
    coord.kill()
    b.kill()  # mid-round too: some of its devices hold a round secret
    secrets_b = sorted(p.parent.name for p in dirs[1].glob("devices/*/round.fms"))

    store = open_store_readonly(database_url)
    try:
        assert store.get_round(2).state.value == "masked_input"  # left behind by the crash
        v_before = store.latest_model_version("synthetic")
        assert v_before.round_number == 1
    finally:
        store.close()

    coord2 = procs.start("coordinator", coordinator_args(port, database_url, masked_input_deadline=1.5, rounds=1,
                                                         **common))
    b2 = procs.start("client-b", client_args(port, "6-10", dirs[1], **cflags))
    coord2.wait(120)
    assert coord2.returncode == 0, coord2.tail()
    procs.check_alive(a, b2)

    rounds = terminal_rounds(database_url)
    assert [r.number for r in rounds] == [1, 2, 3]
    r1, r2, r3 = rounds
    assert r1.state.value == "committed"
    assert r2.state.value == "aborted" and r2.abort_reason == "coordinator_restart" and r2.ended_at is not None
    assert r3.state.value == "committed", r3
    assert r3.base_model_version == v_before.id  # on top of the last committed version
    check_exact_aggregate(r1, dirs)
    counted = check_exact_aggregate(r3, dirs)
    plan = FaultPlan(drop_rate=0.2, drop_stage="masked-input", seed=seed)
    assert set(counted) == {d for d in range(1, N + 1) if plan.drop_stage_of(d, 3) is None}
    enrolled_b = json.loads((dirs[1] / "enrollment.json").read_text())
    b_ids = set(next(iter(enrolled_b.values())).values())
    assert b_ids & set(counted), "the restarted client's devices did not take part"

    store = open_store_readonly(database_url)
    try:
        versions = sorted(store.list_model_versions(limit=100).items, key=lambda v: v.id)
        assert [v.round_number for v in versions] == [None, 1, 3]
        assert [v.hyperparameters["step"] for v in versions] == [0, 1, 2]
        assert [v.created_at for v in versions] == sorted(v.created_at for v in versions)
        for v in versions:
            full = store.get_model_version(v.id)  # raises CorruptBlobError on a mismatch
            assert sha256_hex(full.parameters) == v.sha256 == full.sha256
        assert store.latest_model_version("synthetic").id == versions[-1].id
    finally:
        store.close()

    # the killed client found its unfinished round at start-up, declined it and wiped the secrets
    if secrets_b:  # (a kill during the wipe itself leaves an unreadable secret: wiped too)
        assert "declining unfinished round 2" in b2.log() or "unreadable round secret" in b2.log()
    wait_until(lambda: not list(dirs[1].glob("devices/*/round.fms")), 10, what="the restarted client's secrets wiped")


def _private(state_dir: Path, local_id: str) -> tuple[str, dict, dict]:
    path = state_dir / "devices" / local_id / "model-fedrap.fms"
    got = read_arrays(path)
    assert got is not None, f"no private FedRAP state for {local_id}"
    arrays, meta = got
    return hashlib.sha256(path.read_bytes()).hexdigest(), arrays, meta


@pytest.mark.timeout(240)
def test_client_crash_after_round_restarts_with_its_private_state(procs: Processes, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'coordinator.db'}"
    port = free_port()
    coord = procs.start("coordinator", coordinator_args(
        port, db, model="fedrap", model_params={"n_users": 200, "n_items": 300, "k": 8, "local_epochs": 2},
        cohort_size=8, cohort_minimum=8, over_selection=0.0, allow_consecutive=True, rounds=2, seed=1,
        round_pause=3,  # client A exits right after round 1: round 2 must then wait for its restart
        selection_deadline=60, training_deadline=60, advertise_keys_deadline=10, share_keys_deadline=10,
        masked_input_deadline=10, unmasking_deadline=10, secagg_graph="full", secagg_threshold="majority",
        dp_mode="none",
    ))
    wait_serving(port, coord)
    dir_a, dir_b = tmp_path / "client-a", tmp_path / "client-b"
    a = procs.start("client-a", client_args(port, "1-4", dir_a, dataset="synthetic", seed=3, crash_after_round=1,
                                            threads=1))
    b = procs.start("client-b", client_args(port, "5-8", dir_b, dataset="synthetic", seed=3, threads=1))
    assert a.wait(120) == CRASH_EXIT_CODE, a.tail()
    procs.check_alive(coord, b)
    r1 = terminal_rounds(db)[0]
    assert r1.number == 1 and r1.state.value == "committed"

    local_ids = [f"user-{n}" for n in range(1, 5)]
    before = {lid: _private(dir_a, lid) for lid in local_ids}
    store = open_store_readonly(db)
    try:
        v1 = store.latest_model_version("fedrap")
    finally:
        store.close()
    for lid, (_sha, _arrays, meta) in before.items():
        # the state written in the last round the client completed, from the version that round started on
        assert meta["round_number"] == 1, (lid, meta)
        assert meta["model_version"] == r1.base_model_version
    # (a round secret whose background wipe the abrupt exit cut short may remain: the restart declines it)

    a2 = procs.start("client-a", client_args(port, "1-4", dir_a, dataset="synthetic", seed=3, threads=1))
    coord.wait(180)
    assert coord.returncode == 0, coord.tail()
    procs.check_alive(a2, b)
    rounds = terminal_rounds(db)
    assert [r.state.value for r in rounds] == ["committed", "committed"]
    assert rounds[1].base_model_version == v1.id
    after = {lid: _private(dir_a, lid) for lid in local_ids}
    enrolled = json.loads((dir_a / "enrollment.json").read_text())
    ids_a = set(next(iter(enrolled.values())).values())
    assert ids_a <= set(rounds[1].survivors["masked_input"])  # the restarted devices contributed
    for lid in local_ids:
        sha0, arrays0, _ = before[lid]
        sha1, arrays1, meta1 = after[lid]
        assert meta1["round_number"] == 2 and meta1["model_version"] == v1.id
        assert sha1 != sha0  # it kept training
        assert set(arrays1) == set(arrays0)
        assert any(not np.array_equal(arrays0[k], arrays1[k]) for k in arrays0)
    assert "re-initialising" not in a2.log()  # the stored state was used, not a fresh one
    wait_until(lambda: not list(dir_a.glob("devices/*/round.fms")), 10, what="every round secret wiped")
