"""FedMMF hybrid rounds over real processes and mTLS (D64-D66).

One coordinator process (`fedmask coordinator --model fedmmf
--unprotected-plaintext-j-bound 1e9`, mTLS from `fedmask certs init`, cohort
of 6 on the complete graph, threshold 4) and two edge-client processes
(`--dataset synthetic`, recording their encoded inputs): client A hosts
users 1-2 and consents to plaintext (`--unprotected-plaintext-j-bound 1e9`),
client B hosts users 3-6 and does not. One round:

- A's two devices send their update in plaintext, B's four run secure
  aggregation among themselves;
- the committed aggregate is the plaintext sum of all six counted devices'
  encoded inputs (debug checksum), the plaintext inputs included;
- the record names which devices took the plaintext path and counts both
  paths (`hybrid.*` metrics), and the coordinator logged each plaintext input.

Also: the coordinator refuses the policy without TLS, at start-up.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from integration_harness import (
    Processes,
    client_args,
    coordinator_args,
    events,
    free_port,
    recorded_input,
    terminal_rounds,
    wait_serving,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

MODEL = {"n_users": 200, "n_items": 300, "k": 8, "mask_steps": 30}


def test_plaintext_and_secure_devices_commit_the_exact_sum(procs: Processes, tmp_path: Path) -> None:
    import grpc

    from coordinator.debug import encoded_checksum

    pki = tmp_path / "pki"
    certs = procs.start("certs", ["certs", "init", str(pki), "--devices", "2"])
    assert certs.wait(60) == 0, certs.tail()
    db = f"sqlite:///{tmp_path / 'coordinator.db'}"
    port = free_port()
    coord = procs.start("coordinator", coordinator_args(
        port, db, auth="mtls", tls_cert=pki / "coordinator.pem", tls_key=pki / "coordinator.key",
        tls_client_ca=pki / "ca.pem", require_client_cert=True,
        model="fedmmf", model_params=MODEL, cohort_size=6, cohort_minimum=6, over_selection=0.0, rounds=1,
        selection_deadline=60, secagg_graph="full", secagg_threshold="majority", dp_mode="none",
        debug_record_sums=True, unprotected_plaintext_j_bound=1e9,
    ))
    dev = [(pki / "devices" / f"device-000{i}.pem", pki / "devices" / f"device-000{i}.key") for i in (1, 2)]
    ca = (pki / "ca.pem").read_bytes()
    wait_serving(port, coord, credentials=grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=dev[0][1].read_bytes(), certificate_chain=dev[0][0].read_bytes()))
    dirs = {"a": tmp_path / "client-a", "b": tmp_path / "client-b"}
    common = dict(dataset="synthetic", seed=3, threads=1, debug_record_inputs=True, tls_ca=pki / "ca.pem")
    a = procs.start("client-a", client_args(port, "1-2", dirs["a"], tls_cert=dev[0][0], tls_key=dev[0][1],
                                            unprotected_plaintext_j_bound=1e9, **common))
    b = procs.start("client-b", client_args(port, "3-6", dirs["b"], tls_cert=dev[1][0], tls_key=dev[1][1], **common))
    coord.wait(180)
    assert coord.returncode == 0, coord.tail()
    (rec,) = terminal_rounds(db)
    assert rec.state.value == "committed", (rec.abort_reason, coord.tail())
    plaintext = list(rec.survivors["plaintext"])
    secure = list(rec.survivors["masked_input"])
    assert len(plaintext) == 2 and len(secure) == 4 and not set(plaintext) & set(secure)
    for d in plaintext:  # the plaintext devices are client A's (it alone consented)
        recorded_input([dirs["a"]], rec.number, d)
    assert set(rec.survivors["advertise_keys"]) == set(secure)  # only the secure devices advertised keys
    assert rec.metrics["hybrid.plaintext_devices"] == 2 and rec.metrics["hybrid.secure_devices"] == 4
    assert rec.metrics["hybrid.unprotected_contributions"] == 2
    assert rec.metrics["debug.counted"] == 6 and rec.metrics["contributors"] == 6
    vectors = [recorded_input(dirs.values(), rec.number, d) for d in plaintext + secure]
    total = np.asarray(np.sum(np.stack(vectors), axis=0, dtype=np.uint64), dtype=np.uint32)
    assert encoded_checksum(total) == rec.metrics["debug.encoded_checksum"]
    assert rec.metrics["count.devices"] == 6  # the metric totals cover both paths
    logged = events(coord.log(), "plaintext_input")
    assert sorted(int(e["device"]) for e in logged) == sorted(plaintext)
    assert "UNPROTECTED plaintext updates" in a.log() and "UNPROTECTED" not in b.log()


def test_the_coordinator_refuses_the_policy_without_tls(procs: Processes, tmp_path: Path) -> None:
    coord = procs.start("coordinator", coordinator_args(
        free_port(), f"sqlite:///{tmp_path / 'c.db'}", model="fedmmf", model_params=MODEL,
        unprotected_plaintext_j_bound=0.5,
    ))
    assert coord.wait(60) != 0
    assert "needs TLS on the device listener" in coord.log()
