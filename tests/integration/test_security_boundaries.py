"""Security boundaries of a real coordinator (processes on 127.0.0.1):

- Enrolment is idempotent under concurrency on PostgreSQL (D23): two calls
  of one client enrolling the same fresh keys with the same user handles
  at the same moment, while other callers enrol, both get the same ids and
  never PERMISSION_DENIED.
- Ids at the boundary (D83): every 64-bit integer field of every message a
  peer can send (enumerated from the proto descriptors, so a new field is
  covered the day it is added) is refused INVALID_ARGUMENT when it is
  2^63 or more, on the device listener and on the admin listener, before
  anything looks it up; no exception text reaches the peer and the
  coordinator logs no traceback.
- Metric slots (D35): a device that writes the largest values the
  validation slots once allowed (10^6 users, all of them hits) into its
  metric limbs no longer sets the round's hit rate to about 1.0: its
  report is out of range and the round commits without metrics.
- Debug records: the encoded inputs `--debug-record-inputs` writes are the
  client's private data, 0700 folders and 0600 files.
"""

from __future__ import annotations

import hashlib
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from edge_client.transport import signed_enroll_request
from fedmask_proto.v1 import admin_service_pb2, coordinator_service_pb2, coordinator_service_pb2_grpc, enrollment_pb2
from fedmask_proto.v1 import session_pb2 as S
from integration_harness import (
    LOOPBACK,
    Processes,
    check_exact_aggregate,
    client_args,
    coordinator_args,
    events,
    free_port,
    health_status,
    terminal_rounds,
    wait_serving,
    wait_until,
)
from wire.id_bounds import int64_field_paths, message_with, out_of_range_values
from wire.protocol import PROTOCOL_VERSION

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


# --------------------------------------------------------------------------- concurrent enrolment (PostgreSQL)

TWIN_CALLS = 40  # pairs of simultaneous calls enrolling the same fresh keys
TWIN_BATCH = 4


def _key(tag: str) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(tag.encode()).digest())


def _enroll(stub: coordinator_service_pb2_grpc.CoordinatorServiceStub,
            devices: list[tuple[str, Ed25519PrivateKey]]) -> enrollment_pb2.EnrollRequest:
    challenge = stub.EnrollChallenge(enrollment_pb2.EnrollChallengeRequest(), timeout=30).challenge
    return signed_enroll_request(challenge, "twin", devices)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_one_client_enrolling_the_same_keys_twice_at_once_gets_the_same_ids(
        procs: Processes, database_url: str) -> None:
    port = free_port()
    coord = procs.start("coordinator", coordinator_args(
        port, database_url, model="synthetic", model_params={"vector_length": 8}, enroll_rate=100_000))
    wait_serving(port, coord)
    target = f"{LOOPBACK}:{port}"
    stop = threading.Event()
    gate = threading.Barrier(2)
    answers: dict[int, list[list[int] | str]] = {0: [], 1: []}
    other_failures: list[str] = []
    other_calls = [0]

    def twin(t: int) -> None:
        with grpc.insecure_channel(target) as channel:
            stub = coordinator_service_pb2_grpc.CoordinatorServiceStub(channel)
            try:
                for n in range(TWIN_CALLS):
                    batch = [(f"twin-{n}-{i}", _key(f"twin-{n}-{i}")) for i in range(TWIN_BATCH)]
                    request = _enroll(stub, batch)  # each call proves possession over its own challenge
                    gate.wait(30)
                    try:
                        answers[t].append([d.device_id for d in stub.Enroll(request, timeout=30).devices])
                    except grpc.RpcError as exc:
                        answers[t].append(f"{exc.code().name}: {exc.details()}")
            finally:
                gate.abort()
                stop.set()

    def other(o: int) -> None:
        with grpc.insecure_channel(target) as channel:
            stub = coordinator_service_pb2_grpc.CoordinatorServiceStub(channel)
            n = 0
            while not stop.is_set():
                batch = [(f"other-{o}-{n}-{i}", _key(f"other-{o}-{n}-{i}")) for i in range(TWIN_BATCH)]
                try:
                    stub.Enroll(_enroll(stub, batch), timeout=30)
                except grpc.RpcError as exc:
                    other_failures.append(f"{exc.code().name}: {exc.details()}")
                other_calls[0] += 1
                n += 1

    threads = [threading.Thread(target=twin, args=(t,)) for t in (0, 1)]
    threads += [threading.Thread(target=other, args=(o,)) for o in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(90)
    assert not any(th.is_alive() for th in threads)
    procs.check_alive(coord)

    refused = [a for a in answers[0] + answers[1] if isinstance(a, str)]
    assert refused == [], f"{len(refused)} of {2 * TWIN_CALLS} calls refused, first: {refused[0]}"
    assert answers[0] == answers[1], "the two calls of a pair got different ids"
    assert len(answers[0]) == TWIN_CALLS
    assert other_failures == [] and other_calls[0] > 0
    assert "Traceback" not in coord.log()
    assert events(coord.log(), "enroll_refused") == []


# --------------------------------------------------------------------------- ids at the boundary

SERVICES = (coordinator_service_pb2.DESCRIPTOR.services_by_name["CoordinatorService"],
            admin_service_pb2.DESCRIPTOR.services_by_name["CoordinatorAdmin"])
HELLO = S.ClientMessage(hello=S.Hello(client_name="huge-ids", protocol_version=PROTOCOL_VERSION))
PROOF = S.ClientMessage(proof=S.DeviceProofs())


def _id_cases() -> list[tuple[str, bool, type[Message], str, int]]:
    """(method path, client-streaming, request type, field path, bad value)
    for every 64-bit integer field of every request of both services, from
    the descriptors: a field added tomorrow is a case here at once."""
    cases = []
    for service in SERVICES:
        for method in service.methods:
            request_type = GetMessageClass(method.input_type)
            for path in int64_field_paths(request_type):
                for bad in out_of_range_values(request_type, path):
                    cases.append((f"/{service.full_name}/{method.name}", method.client_streaming, request_type,
                                  path, bad))
    return cases


def _stream_answer(channel: grpc.Channel, method: str, messages: list[Message]) -> tuple[grpc.StatusCode, str]:
    """Send `messages` on a Session stream, keep it open until the server
    ends it (or 5 s pass); its status and detail."""
    done = threading.Event()

    def requests() -> Iterator[bytes]:
        for m in messages:
            yield m.SerializeToString()
        done.wait(5)

    call = channel.stream_stream(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
    try:
        for _ in call(requests(), timeout=10):
            pass
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    finally:
        done.set()


def test_every_64_bit_integer_a_peer_sends_is_checked_at_the_boundary(procs: Processes, tmp_path: Path) -> None:
    port, admin_port = free_port(), free_port()
    coord = procs.start("coordinator", coordinator_args(
        port, f"sqlite:///{tmp_path / 'coordinator.db'}", model="synthetic", model_params={"vector_length": 8},
        admin_listen=f"{LOOPBACK}:{admin_port}", admin_auth="none", session_rate=10_000))
    wait_serving(port, coord)
    cases = _id_cases()
    assert len(cases) >= 60  # ~30 fields, two values each
    answers: dict[tuple[str, str, int], tuple[grpc.StatusCode, str]] = {}
    with grpc.insecure_channel(f"{LOOPBACK}:{port}") as devices, \
            grpc.insecure_channel(f"{LOOPBACK}:{admin_port}") as admin:
        for method, streaming, request_type, path, bad in cases:
            message = message_with(request_type, path, bad)
            if streaming:  # Session: where the message comes in the stream's contract
                kind = path.split(".")[0]
                stream = [message, PROOF] if kind == "hello" else [HELLO, message] if kind == "proof" \
                    else [HELLO, PROOF, message]
                answers[(method, path, bad)] = _stream_answer(devices, method, stream)
                continue
            channel = admin if "CoordinatorAdmin" in method else devices
            call: grpc.UnaryUnaryMultiCallable[Message, bytes] = channel.unary_unary(
                method, request_serializer=lambda m: m.SerializeToString(), response_deserializer=lambda b: b)
            try:
                call(message, timeout=10)
                answers[(method, path, bad)] = (grpc.StatusCode.OK, "")
            except grpc.RpcError as exc:
                answers[(method, path, bad)] = (exc.code(), exc.details() or "")
    wrong = {k: v for k, v in answers.items() if v[0] is not grpc.StatusCode.INVALID_ARGUMENT}
    assert wrong == {}, f"{len(wrong)} of {len(answers)} not refused INVALID_ARGUMENT: {wrong}"
    for (_, path, bad), (_, detail) in answers.items():
        field = path.rsplit(".", 1)[-1]
        assert f"{field} = {bad}" in detail or f"{field}[0] = {bad}" in detail, (path, detail)
        assert "Traceback" not in detail and "Error" not in detail and "<class" not in detail, detail
    assert health_status(port) == "SERVING"
    procs.check_alive(coord)
    log = coord.log()
    assert "Traceback" not in log and "rpc_failed" not in log and "handler_failed" not in log
    assert events(log, "session_refused") and events(log, "rpc_refused")  # logged (at most once a second per kind)


# --------------------------------------------------------------------------- metric slots, debug records

#: The largest validation values one device could put in the sampled slots
#: before their bounds were tightened to one held-out item per device: 10^6
#: validation users, every one a hit with NDCG 1.
OLD_WORST_CASE = ("val_sampled_count=1000000", "val_sampled_hits@10=1000000", "val_sampled_ndcg@10=1000000")


def test_a_device_forging_the_old_largest_validation_report_no_longer_sets_the_hit_rate(
        procs: Processes, tmp_path: Path) -> None:
    """Three honest FedRAP devices and one hostile device (its own client)
    that writes the old per-device maxima into its validation limbs. Before
    the bounds were tightened the round recorded val_hr@10 ~ 1.0 (10^6 hits
    over 10^6 + 3 users); now that report is out of range, so the round
    commits with its exact aggregate and its metrics marked unavailable.
    The records `--debug-record-inputs` wrote are owner-only."""
    db = f"sqlite:///{tmp_path / 'coordinator.db'}"
    port = free_port()
    coord = procs.start("coordinator", coordinator_args(
        port, db, model="fedrap", model_params={"n_users": 200, "n_items": 300, "k": 8, "local_epochs": 1},
        cohort_size=4, cohort_minimum=4, over_selection=0.0, allow_consecutive=True, seed=1, round_pause=600,
        selection_deadline=60, training_deadline=60, advertise_keys_deadline=10, share_keys_deadline=10,
        masked_input_deadline=10, unmasking_deadline=10, secagg_graph="full", secagg_threshold="majority",
        dp_mode="none", debug_record_sums=True))
    wait_serving(port, coord)
    dirs = {"honest": tmp_path / "honest", "hostile": tmp_path / "hostile"}
    common = dict(dataset="synthetic", seed=3, threads=1, debug_record_inputs=True)
    clients = [procs.start("honest", client_args(port, "1-3", dirs["honest"], **common)),
               procs.start("hostile", client_args(port, "4", dirs["hostile"], **common)
                           + [arg for v in OLD_WORST_CASE for arg in ("--fault-forged-metric", v)])]
    wait_until(lambda: terminal_rounds(db), 150, what="round 1 to end", watch=[coord, *clients], step=0.2)
    (record,) = terminal_rounds(db)
    assert record.state.value == "committed", record
    assert len(check_exact_aggregate(record, list(dirs.values()))) == 4
    assert record.metrics.get("val_hr@10", 0.0) < 0.99, record.metrics  # was ~1.0
    assert record.metrics.get("metrics_unavailable") == 1.0, record.metrics
    assert events(coord.log(), "metrics_unavailable")

    # the encoded inputs in the clear: 0700 folders, 0600 files
    for d in dirs.values():
        folders = [d / "debug", *[p for p in (d / "debug").rglob("*") if p.is_dir()]]
        files = [p for p in (d / "debug").rglob("*") if p.is_file()]
        assert len(files) >= 1 and len(folders) >= 3
        assert {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in folders} == {str(p): "0o700" for p in folders}
        assert {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {str(p): "0o600" for p in files}
