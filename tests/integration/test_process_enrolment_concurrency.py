"""Enrolments in parallel with live rounds, with real processes on 127.0.0.1,
on SQLite and PostgreSQL.

A coordinator (synthetic model, `--debug-record-sums`) runs secure rounds
with two edge-client processes (10 devices, synthetic updates,
`--debug-record-inputs`) while several callers in the test process enrol
batches of devices over gRPC (the Enroll RPC, one channel each), with keys
overlapping between callers and batches enrolled again. Asserted: zero
failed Enroll calls, every key got one device id (the same for every caller
that enrolled it), zero aborted rounds while the callers ran, and every
committed aggregate equals bit for bit the sum of the counted devices'
encoded inputs.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import grpc
import pytest

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edge_client.transport import signed_enroll_request
from fedmask_proto.v1 import coordinator_service_pb2_grpc, enrollment_pb2
from integration_harness import (
    LOOPBACK,
    Processes,
    check_exact_aggregate,
    client_args,
    coordinator_args,
    events,
    free_port,
    open_store_readonly,
    terminal_rounds,
    wait_serving,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

N = 10  # real devices: users 1-5 in client A, 6-10 in client B
L = 32
ROUNDS = 3  # committed rounds to see while the callers enrol
CALLERS = 4
BATCH = 40  # half of each batch is shared with the next caller's


def identity_key(caller: int, call: int, i: int) -> tuple[str, Ed25519PrivateKey]:
    """(local_id, identity key) of device i of a caller's call: keys i >= BATCH/2
    are also the first half of caller+1's same call (a race on new keys)."""
    owner, j = (caller, i) if i < BATCH // 2 else ((caller + 1) % CALLERS, i - BATCH // 2)
    seed = hashlib.sha256(b"key-%d-%d-%d" % (owner, call, j)).digest()
    return f"c{caller}-{call}-{i}", Ed25519PrivateKey.from_private_bytes(seed)


class Caller(threading.Thread):
    """Enrols batch after batch until `stop` is set; every third call
    repeats the previous batch (idempotent re-enrolment)."""

    def __init__(self, index: int, port: int, stop: threading.Event) -> None:
        super().__init__(name=f"enroller-{index}")
        self.index, self.port, self.stop_event = index, port, stop
        self.calls = 0
        self.failures: list[str] = []
        self.ids: dict[bytes, set[int]] = {}

    def run(self) -> None:
        with grpc.insecure_channel(f"{LOOPBACK}:{self.port}") as channel:
            stub = coordinator_service_pb2_grpc.CoordinatorServiceStub(channel)
            batch_no = 0
            while not self.stop_event.is_set():
                if self.calls % 3 != 2:
                    batch_no += 1
                batch = [identity_key(self.index, batch_no, i) for i in range(BATCH)]
                self.calls += 1
                try:  # each device proves possession over a fresh challenge (fedmask.v1.1)
                    challenge = stub.EnrollChallenge(enrollment_pb2.EnrollChallengeRequest(), timeout=30).challenge
                    request = signed_enroll_request(challenge, f"enroller-{self.index}", batch)
                    response = stub.Enroll(request, timeout=30)
                except grpc.RpcError as exc:
                    self.failures.append(f"{exc.code()}: {exc.details()}")
                    continue
                if [d.local_id for d in response.devices] != [lid for lid, _ in batch]:
                    self.failures.append("the answer does not list the batch in order")
                    continue
                for (_, k), d in zip(batch, response.devices, strict=True):
                    self.ids.setdefault(k.public_key().public_bytes_raw(), set()).add(d.device_id)


@pytest.mark.parametrize("database_url", ["sqlite", "postgresql"], indirect=True)
def test_parallel_enrolments_during_live_rounds(procs: Processes, tmp_path: Path, database_url: str) -> None:
    port = free_port()
    coord = procs.start("coordinator", coordinator_args(
        port, database_url, model="synthetic", model_params={"vector_length": L},
        cohort_size=N, cohort_minimum=N, over_selection=0.0, allow_consecutive=True, seed=1,
        selection_deadline=30, training_deadline=2, advertise_keys_deadline=10, share_keys_deadline=10,
        masked_input_deadline=10, unmasking_deadline=10, secagg_graph="full", secagg_threshold="majority",
        dp_mode="none", debug_record_sums=True,
        # every caller is 127.0.0.1, one peer: lift the per-peer Enroll limit
        # (tested on its own in tests/coordinator/test_grpc_limits.py); this
        # test is about the store under concurrent writers
        enroll_rate=100_000,
    ))
    wait_serving(port, coord)
    stop = threading.Event()
    callers = [Caller(i, port, stop) for i in range(CALLERS)]
    for c in callers:
        c.start()
    dirs = [tmp_path / "client-a", tmp_path / "client-b"]
    cflags = dict(dataset="synthetic", seed=5, debug_record_inputs=True, threads=1)
    clients = [procs.start(f"client-{i}", client_args(port, users, dirs[i], **cflags))
               for i, users in enumerate(("1-5", "6-10"))]
    try:
        wait_until(lambda: len(terminal_rounds(database_url)) >= ROUNDS, 90,
                   what=f"{ROUNDS} rounds to end while enrolling", watch=[coord, *clients], step=0.3)
    finally:
        stop.set()
        for c in callers:
            c.join(40)
    during = terminal_rounds(database_url)  # every round that ended while the callers enrolled
    procs.check_alive(coord, *clients)

    # -- enrolment: no failure, one id per key, distinct keys -> distinct ids
    assert [c.failures for c in callers] == [[]] * CALLERS
    assert all(c.calls >= 3 for c in callers), [c.calls for c in callers]
    ids: dict[bytes, set[int]] = {}
    for c in callers:
        for k, got in c.ids.items():
            ids.setdefault(k, set()).update(got)
    assert all(len(v) == 1 for v in ids.values()), "a key was given two device ids"
    by_id = [next(iter(v)) for v in ids.values()]
    assert len(set(by_id)) == len(by_id), "two keys share a device id"

    # -- rounds: none aborted, every committed aggregate exact, no commit failure
    assert len(during) >= ROUNDS
    assert [r.number for r in during] == list(range(1, len(during) + 1))
    assert [(r.number, r.state.value, r.abort_reason) for r in during if r.state.value != "committed"] == []
    for r in during:
        assert len(check_exact_aggregate(r, dirs)) == N  # nobody dropped
    procs.stop(coord)
    log = coord.log()
    assert events(log, "commit_failed") == [] and "internal coordinator error" not in log
    assert "database is locked" not in log

    store = open_store_readonly(database_url)
    try:
        stored = {bytes(d.identity_public_key): d.id for d in store.list_devices()}
    finally:
        store.close()
    assert all(stored[k] == next(iter(v)) for k, v in ids.items())
    assert len(stored) == len(ids) + N  # the callers' devices and the two clients' own
