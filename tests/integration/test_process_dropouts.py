"""Dropouts injected at every secagg stage, with real processes on 127.0.0.1.

One coordinator (`python -m fedmask coordinator`, synthetic model) and two
edge-client processes (`python -m fedmask client`, 10 devices each,
synthetic-update mode) run three secure rounds over the whole cohort of 20.
Both clients use `--drop-rate RATE --drop-stage STAGE` with the same seed,
so which devices go silent in which round is a pure function of (seed,
round, device id) (edge_client.faults.FaultPlan), whatever client hosts
them: the test predicts the dropouts exactly and picks the seed:

  * 10%: every round keeps at least t devices (it commits) and at least two
    devices drop over the run;
  * 30%: round 1 loses more than n - t devices (it aborts with the typed
    reason too_few_survivors) and rounds 2 and 3 commit with some dropouts.

Each committed aggregate must equal, bit for bit, the sum of the encoded
inputs of exactly the devices the coordinator counted (coordinator
`--debug-record-sums` checksum vs. the clients' `--debug-record-inputs`),
and its float decoding must match the plaintext float sum of the synthetic
updates within the quantization error.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from edge_client.faults import FaultPlan
from integration_harness import (
    Processes,
    check_exact_aggregate,
    client_args,
    coordinator_args,
    free_port,
    synthetic_sum,
    terminal_rounds,
    wait_serving,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

N = 20  # devices: users 1-10 in client A, 11-20 in client B -> device ids 1..20
L = 48
ROUNDS = 3
T = N // 2 + 1  # full graph, "majority" threshold
CLIP = 1.0
DEADLINE = 1.5  # per stage; a silent device costs one


def predicted_drops(seed: int, rate: float, stage: str) -> list[set[int]]:
    plan = FaultPlan(drop_rate=rate, drop_stage=stage, seed=seed)
    return [{d for d in range(1, N + 1) if plan.drop_stage_of(d, r) is not None} for r in range(1, ROUNDS + 1)]


def pick_seed(rate: float, stage: str) -> tuple[int, list[set[int]]]:
    for seed in range(10_000):
        drops = predicted_drops(seed, rate, stage)
        sizes = [len(d) for d in drops]
        if rate < 0.2:
            good = all(s <= N - T for s in sizes) and sum(sizes) >= 2
        else:
            good = sizes[0] > N - T and all(1 <= s <= N - T for s in sizes[1:])
        if good:
            return seed, drops
    raise AssertionError("no seed gives the wanted dropout pattern")


def run_federation(procs: Processes, tmp_path: Path, database_url: str, *, seed: int, rate: float, stage: str,
                   rounds: int = ROUNDS) -> tuple[list, list[Path]]:
    port = free_port()
    coord = procs.start("coordinator", coordinator_args(
        port, database_url,
        model="synthetic", model_params={"vector_length": L},
        cohort_size=N, cohort_minimum=N, over_selection=0.0, allow_consecutive=True,
        rounds=rounds, seed=1, selection_deadline=30,
        training_deadline=0.5, advertise_keys_deadline=DEADLINE - 0.5, share_keys_deadline=DEADLINE,
        masked_input_deadline=DEADLINE, unmasking_deadline=DEADLINE,
        secagg_graph="full", secagg_threshold="majority", secagg_clip=CLIP, dp_mode="none",
        debug_record_sums=True,
    ))
    wait_serving(port, coord)
    state_dirs = [tmp_path / "client-a", tmp_path / "client-b"]
    clients = [
        procs.start(f"client-{i}", client_args(
            port, users, state_dirs[i], dataset="synthetic", seed=seed, drop_rate=rate, drop_stage=stage,
            debug_record_inputs=True, threads=1,
        ))
        for i, users in enumerate(("1-10", "11-20"))
    ]
    coord.wait(120)  # --rounds R: the coordinator exits by itself
    assert coord.returncode == 0, coord.tail()
    procs.check_alive(*clients)
    records = terminal_rounds(database_url)
    assert [r.number for r in records] == list(range(1, rounds + 1)), records
    return records, state_dirs


def check_round(record, drops: set[int], stage: str, state_dirs: list[Path], seed: int) -> None:
    phase = stage.replace("-", "_")
    assert record.cohort_size == N and sorted(record.survivors["selected"]) == list(range(1, N + 1))
    if len(drops) > N - T:  # below threshold: aborted with a typed reason
        assert record.state.value == "aborted", record
        assert record.abort_reason == "too_few_survivors", record
        return
    assert record.state.value == "committed", record
    # exactly the predicted devices dropped, at that stage, and nowhere else
    assert {k: set(v) for k, v in record.dropouts.items()} == ({phase: drops} if drops else {}), record.dropouts
    counted = check_exact_aggregate(record, state_dirs)
    if phase == "unmasking":  # their masked inputs are in: they count
        assert counted == list(range(1, N + 1))
    else:
        assert set(counted) == set(range(1, N + 1)) - drops
    # the float decoding against the plaintext float sum of the synthetic updates
    want = synthetic_sum(counted, round_number=record.number, vector_length=L, seed=seed, scale=CLIP)
    step = 2 * CLIP / ((2**32 - 1) // N)
    got = np.array([record.metrics[f"debug.sum[{i}]"] for i in range(16)])
    assert np.abs(got - want[:16]).max() <= len(counted) * step + 1e-9
    assert math.isclose(record.metrics["debug.sum_l1"], float(np.abs(want).sum()), rel_tol=1e-6, abs_tol=1e-3)


@pytest.mark.parametrize("rate", [0.1, 0.3])
@pytest.mark.parametrize("stage", ["advertise-keys", "share-keys", "masked-input", "unmasking"])
def test_dropouts_at_every_stage(procs: Processes, tmp_path: Path, database_url: str, stage: str, rate: float) -> None:
    seed, drops = pick_seed(rate, stage)
    records, state_dirs = run_federation(procs, tmp_path, database_url, seed=seed, rate=rate, stage=stage)
    for record, d in zip(records, drops, strict=True):
        check_round(record, d, stage, state_dirs, seed)
    assert any(r.state.value == "committed" for r in records)
    if rate > 0.2:  # the round after the aborted one commits
        assert records[0].state.value == "aborted" and records[1].state.value == "committed"


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_dropouts_on_postgresql(procs: Processes, tmp_path: Path, database_url: str) -> None:
    stage, rate = "masked-input", 0.3
    seed, drops = pick_seed(rate, stage)
    records, state_dirs = run_federation(procs, tmp_path, database_url, seed=seed, rate=rate, stage=stage)
    for record, d in zip(records, drops, strict=True):
        check_round(record, d, stage, state_dirs, seed)


def test_seed_picking_is_deterministic() -> None:
    assert pick_seed(0.3, "share-keys") == pick_seed(0.3, "share-keys")
    seed, drops = pick_seed(0.3, "unmasking")
    assert len(drops[0]) > N - T and all(0 < len(d) <= N - T for d in drops[1:])
