"""Round metrics over real processes: nothing per device on the wire (D35).

The coordinator runs in the test process (`InProcessCoordinator`) so that
the test can see every ClientMessage it receives; two edge-client
processes host two FedRAP devices each and record their encoded inputs
(`--debug-record-inputs`, loopback debug). After one committed round:

- the coordinator received only Hello, CheckIn, Heartbeat and the secagg
  stage messages (no RoundMetrics, no kind it does not know), and each
  MaskedInput is exactly one masked vector of the round's length (update
  plus metric coordinates);
- the round record's metrics equal the totals of the devices' own metric
  values, which exist only on the devices: each device's recorded input
  ends with its metric limbs, decoded here one device at a time and summed;
- the aggregate is exact (debug checksum).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import unknown_fields

from coordinator.settings import CoordinatorSettings
from integration_harness import (
    InProcessCoordinator,
    Processes,
    check_exact_aggregate,
    client_args,
    open_store_readonly,
    recorded_input,
    terminal_rounds,
    wait_until,
)
from secagg.encoding import FixedPointEncoding
from wire.round_metrics import SLOTS, MetricLayout

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

CLIENTS = {"client-a": "1-2", "client-b": "3-4"}
NAMES = ("devices", "examples", "update_norm", "val_sampled_hits@10", "val_sampled_ndcg@10", "val_sampled_count",
         "clipped")
ALLOWED = {"check_in", "heartbeat", "proof", "advertise_keys", "share_keys", "share_receipt", "masked_input", "unmasking_response"}


def _settings(db: str) -> CoordinatorSettings:
    return CoordinatorSettings.load(overrides={
        "listen_address": "127.0.0.1:0",
        "database_url": db,
        "model.name": "fedrap",
        "model.hyperparameters": {"n_users": 200, "n_items": 300, "k": 8, "local_epochs": 1},
        "cohort.size": 4, "cohort.minimum": 4, "cohort.over_selection": 0.0, "cohort.allow_consecutive": True,
        "cohort.pause": 600.0, "rounds": 1,
        "deadlines.selection": 60, "deadlines.training": 60, "deadlines.advertise_keys": 10,
        "deadlines.share_keys": 10, "deadlines.masked_input": 10, "deadlines.unmasking": 10,
        "secagg.graph": "full", "secagg.threshold": "majority",
        # the float Gaussian: under the discrete Gaussian no metric totals are asked for (D36 amended, D88)
        "dp.mode": "local", "dp.mechanism": "gaussian-float", "dp.noise_multiplier": 0.5, "dp.clip": 0.1,
        "debug.record_sums": True, "seed": 1,
    })


def test_the_coordinator_learns_only_metric_totals(procs: Processes, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'coordinator.db'}"
    dirs = {name: tmp_path / name for name in CLIENTS}
    received: list[Any] = []
    with InProcessCoordinator(_settings(db), tmp_path) as coord:
        real_handle = coord.coordinator.handle

        async def spying_handle(session: Any, message: Any) -> None:
            received.append(copy.deepcopy(message))
            await real_handle(session, message)

        coord.coordinator.handle = spying_handle  # the servicer looks it up per message
        port = coord.port
        assert port is not None
        clients = [procs.start(name, client_args(port, users, dirs[name], dataset="synthetic", seed=3,
                                                 threads=1, debug_record_inputs=True))
                   for name, users in CLIENTS.items()]
        wait_until(lambda: terminal_rounds(db), 150, what="round 1 to end", watch=clients, step=0.2)
        for c in clients:
            assert c.stop() == 0
    (record,) = terminal_rounds(db)
    assert record.state.value == "committed", record

    # what reached the coordinator: stage messages and control messages only
    kinds = [m.WhichOneof("message") for m in received]
    assert set(kinds) <= ALLOWED, set(kinds) - ALLOWED
    assert kinds.count("masked_input") == 4
    assert all(len(unknown_fields.UnknownFieldSet(m)) == 0 for m in received)  # nothing beyond the schema
    counted = check_exact_aggregate(record, list(dirs.values()))
    assert sorted(counted) == sorted(m.masked_input.device_id for m in received if m.HasField("masked_input"))
    length = {m.masked_input.length for m in received if m.HasField("masked_input")}
    (vector_length,) = length

    # the devices' own values: the last coordinates of each recorded input, decoded one device at a time
    secagg = _settings(db).secagg
    layout = MetricLayout.for_round(NAMES, FixedPointEncoding.for_cohort(4, clip=secagg.clip,
                                                                         modulus_bits=secagg.modulus_bits))
    assert vector_length > layout.coordinates
    per_device = []
    for d in counted:
        limbs = recorded_input(dirs.values(), record.number, d)[-layout.coordinates:]
        assert limbs.shape == (layout.coordinates,) and len(limbs) + 1 <= vector_length
        per_device.append(layout.decode(np.ascontiguousarray(limbs), 1))
    for name in NAMES:
        slot = SLOTS[name]
        if slot.is_count:
            assert record.metrics[f"count.{name}"] == sum(c[name] for _, c in per_device), name
        else:
            assert record.metrics[f"sum.{name}"] == pytest.approx(sum(s[name] for s, _ in per_device), abs=1e-9), name
    assert record.metrics["count.devices"] == 4 == record.metrics["contributors"]
    assert record.metrics["count.val_sampled_count"] == 4  # one validation item per device
    assert record.metrics["val_hr@10"] == record.metrics["count.val_sampled_hits@10"] / 4
    assert "metrics_unavailable" not in record.metrics


def test_a_device_with_garbage_metrics_costs_only_the_metrics(procs: Processes, tmp_path: Path) -> None:
    """Over real processes: client-b's devices put 2^32 - 1 in every
    metric coordinate (--fault-garbage-metrics). The round commits with all four
    devices counted, the aggregate is exactly their inputs' sum, and the round's
    metrics are marked unavailable, not wrong."""
    db = f"sqlite:///{tmp_path / 'coordinator.db'}"
    dirs = {name: tmp_path / name for name in CLIENTS}
    with InProcessCoordinator(_settings(db), tmp_path) as coord:
        port = coord.port
        assert port is not None
        clients = [procs.start(name, client_args(port, users, dirs[name], dataset="synthetic", seed=3, threads=1,
                                                 debug_record_inputs=True,
                                                 fault_garbage_metrics=(name == "client-b")))
                   for name, users in CLIENTS.items()]
        wait_until(lambda: terminal_rounds(db), 150, what="round 1 to end", watch=clients, step=0.2)
        for c in clients:
            assert c.stop() == 0
    (record,) = terminal_rounds(db)
    assert record.state.value == "committed", record
    assert len(check_exact_aggregate(record, list(dirs.values()))) == 4
    assert record.metrics["metrics_unavailable"] == 1.0
    assert not [k for k in record.metrics if k.startswith(("count.", "sum.", "val_"))]
    store = open_store_readonly(db)
    try:
        assert [v.round_number for v in store.list_model_versions(limit=10).items if v.round_number] == [1]
    finally:
        store.close()
