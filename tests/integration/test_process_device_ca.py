"""The device CA as an operator runs it (D33), with real processes on
127.0.0.1: `fedmask certs init`, a coordinator in active mode with
`--device-ca`, an edge client with `--device-ca` that writes certificate
requests, `fedmask certs issue-device` signing them while everything runs,
and then a committed round whose aggregate is exact over every device."""

from __future__ import annotations

from pathlib import Path

import pytest

from integration_harness import (
    Processes,
    check_exact_aggregate,
    client_args,
    coordinator_args,
    free_port,
    terminal_rounds,
    wait_serving,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

L = 32


def test_certificates_issued_while_running_let_the_devices_take_part(procs: Processes, tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    init = procs.start("certs-init", ["certs", "init", str(pki)])
    assert init.wait(60) == 0, init.tail()
    device_ca = pki / "device-ca.pem"
    assert device_ca.exists() and (pki / "device-ca.key").exists()
    db = f"sqlite:///{tmp_path / 'coordinator.db'}"
    port = free_port()
    coord = procs.start("coordinator", coordinator_args(
        port, db, model="synthetic", model_params={"vector_length": L}, cohort_size=4, cohort_minimum=4,
        over_selection=0.0, allow_consecutive=True, round_pause=1.0, selection_deadline=30,
        secagg_graph="full", secagg_threshold="majority", dp_mode="none", debug_record_sums=True,
        signatures=True, consistency_check=True, device_ca=device_ca,
    ))
    wait_serving(port, coord)
    state = tmp_path / "client"
    client = procs.start("client", client_args(port, "1-4", state, dataset="synthetic", debug_record_inputs=True,
                                               threads=1, device_ca=device_ca))
    requests = wait_until(lambda: (r := sorted(state.glob("devices/*/identity-csr.pem"))) and len(r) == 4 and r,
                          60, what="four certificate requests", watch=(coord, client))
    assert "fedmask certs issue-device" in client.log()
    issue = procs.start("certs-issue", ["certs", "issue-device", "--device-ca-dir", str(pki), *map(str, requests)])
    assert issue.wait(60) == 0, issue.tail()
    assert len(list(state.glob("devices/*/identity-cert.pem"))) == 4

    def committed():
        return [r for r in terminal_rounds(db) if r.state.value == "committed"]

    (first, *_) = wait_until(committed, 90, what="a committed round", watch=(coord, client))
    counted = check_exact_aggregate(first, [state])
    assert len(counted) == 4
    procs.check_alive(coord, client)
