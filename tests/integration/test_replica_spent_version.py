"""A leader killed after its unmasking requests went out (D94), over real
processes on PostgreSQL.

Replica A leads with the test-only kill point `unmasking_answered`
(tests/integration/kill_points: it SIGKILLs itself right after it handled
the first unmasking answer of its first round); replica B waits as a
standby. The cohort is the whole population (6 devices), so once A dies
every device has been asked to unmask on version 0 and the ones that
answered refuse that version for good (D85).

Before D94 the successor did not know who had been asked (the round's record
was saved after the requests went out) and aborted round after round on the
spent devices. Now: the record listing who was asked is in the store before
anyone is asked; B aborts the round (`coordinator_restart`), finds the
version spent by a dead coordinator, moves past it with a skip version (the
same parameters at the next step) and commits the next rounds. The version
history keeps no gap and no duplicate step, the skip names the version and
the round it moved past, no other round aborts, and every committed
aggregate is exact. The federation runs under distributed DP (the discrete
Gaussian): B charges the aborted round 1 in the privacy ledger as if A had
released its sum, priced with the devices counted at masked input, and the
cumulative epsilon of the rounds B commits composes it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from coordinator.model_host import build_server_model
from coordinator.round_policy import dp_mechanism_for
from coordinator.settings import CoordinatorSettings
from coordinator.store.blobs import unpack_parameters
from dpmech.calibrate import noise_multiplier_of
from dpmech.mechanism import privacy_rho
from models.privacy import composed_epsilon

from integration_harness import (
    LOOPBACK,
    Processes,
    Proc,
    all_rounds,
    check_exact_aggregate,
    coordinator_args,
    events,
    flags,
    free_port,
    open_store_readonly,
    wait_serving,
    wait_until,
)

pytestmark = [pytest.mark.slow]

KILL_POINTS = Path(__file__).resolve().parent / "kill_points"
LEASE_S = 3.0
L = 32
COMMON: dict[str, Any] = dict(
    model="synthetic", model_params={"vector_length": L}, cohort_size=6, cohort_minimum=4, over_selection=0.0,
    allow_consecutive=True, seed=1, selection_deadline=3, training_deadline=2, advertise_keys_deadline=5,
    share_keys_deadline=5, unmasking_deadline=5, masked_input_deadline=5, secagg_graph="full",
    secagg_threshold="majority", dp_mode="distributed", dp_noise=1.0, debug_record_sums=True, lease_seconds=LEASE_S, round_pause=0.5,
)


def _versions(url: str) -> list[Any]:
    store = open_store_readonly(url)
    try:
        summaries = sorted(store.list_model_versions(limit=1000).items, key=lambda v: v.id)
        return [store.get_model_version(v.id) for v in summaries]
    finally:
        store.close()


def _ledger(url: str) -> list[Any]:
    store = open_store_readonly(url)
    try:
        return store.privacy_ledger()
    finally:
        store.close()


def _multiplier(counted: int) -> float:
    """The oracle: the noise multiplier of the sum of `counted` of the
    cohort's 6 discrete-Gaussian shares, from the mechanism (not the ledger)."""
    s = CoordinatorSettings.load(overrides={"dp.mode": "distributed", "dp.noise_multiplier": 1.0})
    mechanism = dp_mechanism_for(s, COMMON["cohort_size"], build_server_model("synthetic", {"vector_length": L}).update_dim)
    assert mechanism is not None
    return noise_multiplier_of(privacy_rho(mechanism, counted))


def _committed(url: str) -> list[Any]:
    return [r for r in all_rounds(url) if r.state.value == "committed"]


@pytest.mark.timeout(240)
def test_a_leader_killed_after_asking_to_unmask(procs: Processes, tmp_path: Path, postgresql_url: str) -> None:
    url = postgresql_url
    ports = (free_port(), free_port())
    hook = {"PYTHONPATH": os.pathsep.join([str(KILL_POINTS), os.environ.get("PYTHONPATH", "")]),
            "INTEGRATION_TESTS_KILL_POINT": "unmasking_answered"}
    a = procs.start("replica-a", coordinator_args(ports[0], url, replica_id="replica-a", **COMMON), env=hook)
    wait_serving(ports[0], a)
    b = procs.start("replica-b", coordinator_args(ports[1], url, replica_id="replica-b", **COMMON))
    wait_until(lambda: events(b.log(), "standby"), 30, what="replica-b to wait as a standby", watch=[b])
    target = ",".join(f"{LOOPBACK}:{p}" for p in ports)
    dirs = [tmp_path / "client-a", tmp_path / "client-b"]
    clients: list[Proc] = [
        procs.start(d.name, ["client", "--coordinator", target, "--users", users, "--state-dir", str(d),
                             "--no-dp-floor", *flags(dict(dataset="synthetic", seed=0, debug_record_inputs=True,
                                                          threads=1))])
        for d, users in zip(dirs, ("1-3", "4-6"))
    ]

    assert a.wait(90) == -9, a.tail()  # killed at its kill point, in its first round
    died = time.monotonic()
    opened = [e for e in events(a.log(), "stage_opened") if e.get("stage") == "unmasking"]
    assert [e["round"] for e in opened] == ["1"], a.tail()
    wait_until(lambda: events(b.log(), "leader_elected"), 30, what="replica-b to lead", watch=[b])
    assert time.monotonic() - died <= LEASE_S + 5.0
    wait_serving(ports[1], b)
    wait_until(lambda: len(_committed(url)) >= 2, 120, what="2 rounds committed by the new leader",
               watch=[b, *clients], step=0.1)
    assert b.stop() == 0

    killed = all_rounds(url)[0]
    assert killed.number == 1 and killed.state.value == "aborted" and killed.abort_reason == "coordinator_restart"
    asked = set(killed.survivors["masked_input"])
    assert len(asked) >= COMMON["cohort_minimum"], killed.survivors  # saved before the requests went out
    aborted = [r.number for r in all_rounds(url) if r.state.value == "aborted"]
    assert aborted == [1], f"the new leader aborted rounds on spent devices: {aborted}"
    skipped = events(b.log(), "version_skipped")
    assert len(skipped) == 1 and skipped[0]["rounds"] == "1", b.tail()

    versions = _versions(url)
    steps = [v.hyperparameters["step"] for v in versions]
    assert steps == list(range(len(versions))), f"a gap or a duplicate in the version history: {steps}"
    v0, skip = versions[0], versions[1]
    assert skip.round_number is None and skip.hyperparameters["skip_of"] == v0.id
    assert skip.hyperparameters["skipped_rounds"] == [1]
    same = unpack_parameters(skip.parameters), unpack_parameters(v0.parameters)
    assert same[0].keys() == same[1].keys() and all(np.array_equal(same[0][k], same[1][k]) for k in same[0])
    committed = _committed(url)
    assert [v.round_number for v in versions[2:]] == [r.number for r in committed]
    previous = skip.id
    for r in committed:
        assert r.base_model_version == previous, f"round {r.number} did not start from the last version"
        previous = next(v.id for v in versions if v.round_number == r.number)
        check_exact_aggregate(r, dirs)
    assert set(committed[0].survivors["selected"]) & asked, "the skip version re-admits the spent devices"

    # round 1 is charged as released (D94), and every later cumulative composes it
    ledger = _ledger(url)
    assert [e.round_number for e in ledger] == [1, *(r.number for r in committed)], ledger
    charged = ledger[0]
    assert charged.noise_multiplier == pytest.approx(_multiplier(len(asked)), rel=1e-9)
    assert charged.epsilon > 0 and charged.cumulative_epsilon == pytest.approx(charged.epsilon)
    for i, (e, r) in enumerate(zip(ledger[1:], committed, strict=True), start=1):
        assert e.noise_multiplier == pytest.approx(_multiplier(len(r.survivors["masked_input"])), rel=1e-9)
        together = composed_epsilon([(x.noise_multiplier, 1.0) for x in ledger[: i + 1]], delta=charged.delta)
        assert e.cumulative_epsilon == pytest.approx(together, rel=1e-6) and e.cumulative_epsilon > e.epsilon
