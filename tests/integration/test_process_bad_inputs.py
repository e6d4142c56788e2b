"""Bad input against a running coordinator process (127.0.0.1).

A real coordinator and a real edge client (8 honest devices) run a round
together with six scripted devices built only from the generated stubs,
`secagg` and `wire` (tests/coordinator/coordinator_fakes.py), each
misbehaving in one way: a message for the wrong round, a message of a
later stage, a replay, a masked vector of the wrong length, an oversized
message, garbage bytes on the Session stream (a generic stream_stream call
with identity serializers). Each gets a clear status or AbortNotice, leaves
a log line, and only the offender leaves the round: the round commits with
the exact sum of the others and the coordinator stays up (health check).

Authentication: token mode (no / a wrong bearer token -> UNAUTHENTICATED,
also for a real edge client, which exits with code 2; the right token
trains) and mTLS with `fedmask certs init` (no client certificate: the TLS
handshake fails, UNAVAILABLE; a device certificate: OK, and a real edge
client trains).
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

import grpc
import pytest

from edge_client.transport import signed_enroll_request
from fedmask_proto.v1 import common_pb2, coordinator_service_pb2_grpc, enrollment_pb2, secagg_pb2, session_pb2
from secagg import identity
from wire.possession import session_payload
from wire.protocol import PROTOCOL_VERSION
from integration_harness import (
    LOOPBACK,
    Processes,
    check_exact_aggregate,
    client_args,
    coordinator_args,
    events,
    free_port,
    health_status,
    round_record,
    terminal_rounds,
    wait_serving,
    wait_until,
)
from wire.protocol import PROTOCOL_VERSION

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

P = common_pb2
L = 32
SESSION = "/fedmask.v1.CoordinatorService/Session"


def _fakes():
    name = "fedmask_tests_coordinator_fakes"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "coordinator" / "coordinator_fakes.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


fakes = _fakes()


class ScriptedClient(fakes.FakeClient):
    """A FakeClient with a hook: `before_keys(client, msg)` runs before the
    honest reaction to AdvertisedKeys."""

    def __init__(self, *args, before_keys=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.before_keys = before_keys

    def _on(self, msg: session_pb2.ServerMessage) -> None:
        if msg.WhichOneof("message") == "advertised_keys" and self.before_keys is not None:
            self.before_keys(self, msg.advertised_keys)
        super()._on(msg)


async def _garbage_session(target: str, device_id: int, key) -> tuple[grpc.StatusCode, str, int]:
    """A raw Session call with identity serializers: a valid Hello and proof,
    then, once the RoundTask arrived, bytes that are no ClientMessage."""
    async with grpc.aio.insecure_channel(target) as ch:
        call = ch.stream_stream(SESSION, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        queue: asyncio.Queue = asyncio.Queue()
        hello = session_pb2.ClientMessage(hello=session_pb2.Hello(
            client_name="garbage", protocol_version=PROTOCOL_VERSION, available_device_ids=[device_id]))
        await queue.put(hello.SerializeToString())

        async def requests():
            while True:
                item = await queue.get()
                if item is None:
                    return
                yield item

        tasks = 0
        try:
            async for raw in call(requests()):
                msg = session_pb2.ServerMessage.FromString(raw)
                if msg.WhichOneof("message") == "challenge":
                    proof = session_pb2.DeviceProof(device_id=device_id, signature=identity.sign(
                        key, session_payload(msg.challenge.nonce, device_id)))
                    await queue.put(session_pb2.ClientMessage(proof=session_pb2.DeviceProofs(
                        proofs=[proof])).SerializeToString())
                if msg.WhichOneof("message") == "round_task":
                    tasks += 1
                    await queue.put(b"\xff\xfe\xfd not a protobuf \x00\x01")
            return grpc.StatusCode.OK, "", tasks
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or "", tasks


async def _garbage_before_hello(target: str) -> grpc.aio.AioRpcError:
    async with grpc.aio.insecure_channel(target) as ch:
        call = ch.stream_stream(SESSION, request_serializer=lambda b: b, response_deserializer=lambda b: b)

        async def requests():
            yield b"\xff\xff\xff\xff garbage"
            await asyncio.sleep(1)

        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in call(requests()):
                pass
        return info.value


def test_bad_messages_drop_only_the_offender_and_the_round_goes_on(procs: Processes, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'coordinator.db'}"
    port = free_port()
    target = f"{LOOPBACK}:{port}"
    honest, scripted = 8, 6
    coord = procs.start("coordinator", coordinator_args(
        port, db, model="synthetic", model_params={"vector_length": L},
        cohort_size=honest + scripted, cohort_minimum=honest + scripted, over_selection=0.0, allow_consecutive=True,
        seed=1, round_pause=60, selection_deadline=60, training_deadline=1.0, advertise_keys_deadline=2.0,
        share_keys_deadline=1.5, masked_input_deadline=2.0, unmasking_deadline=2.0,
        secagg_graph="full", secagg_threshold="majority", dp_mode="none", debug_record_sums=True,
    ))
    wait_serving(port, coord)
    state = tmp_path / "client"
    real = procs.start("client", client_args(port, f"1-{honest}", state, dataset="synthetic", seed=2,
                                             debug_record_inputs=True, threads=1))

    async def main():
        err = await _garbage_before_hello(target)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "malformed" in err.details()

        enrolled = await fakes.enroll(target, scripted, seed=9)
        ids = [d for d, _ in enrolled]
        wrong_len, wrong_round, later_stage, replay, oversized, garbage = ids
        own_adv: dict[int, secagg_pb2.AdvertiseKeys] = {}

        def tamper(device_id, p):
            if isinstance(p, secagg_pb2.AdvertiseKeys):
                own_adv[device_id] = p
            if device_id == wrong_len and isinstance(p, secagg_pb2.MaskedInput):
                p.masked_vector = p.masked_vector[:-4]  # one word short, length field unchanged
            if device_id == wrong_round and isinstance(p, secagg_pb2.ShareKeys):
                p.round_number += 7  # for a round that does not exist
            if device_id == oversized and isinstance(p, secagg_pb2.MaskedInput):
                p.masked_vector = b"\0" * (6 << 20)  # over the coordinator's receive limit
            if device_id == later_stage and isinstance(p, secagg_pb2.AdvertiseKeys):
                # a stage-2 message instead of its stage-0 one (the stage waits for it: deterministic)
                return secagg_pb2.MaskedInput(session_id=p.session_id, round_number=p.round_number,
                                              device_id=device_id, masked_vector=b"\0" * (4 * L), length=L,
                                              modulus_bits=32)
            return p

        def replay_keys(client, msg):
            client.send_inner(own_adv[replay])  # our stage-0 message again, during stage 1

        keys = dict(enrolled)
        devices = {d: fakes.FakeDevice(d, seed=11, tamper=tamper, identity_key=keys[d]) for d in ids if d != garbage}
        clients = [
            fakes.FakeClient(target, [devices[wrong_len], devices[wrong_round]], name="bad-len-round"),
            fakes.FakeClient(target, [devices[later_stage]], name="later-stage"),
            ScriptedClient(target, [devices[replay]], name="replayer", before_keys=replay_keys),
            fakes.FakeClient(target, [devices[oversized]], name="oversized"),
        ]
        for c in clients:
            await c.start()
        garbage_task = asyncio.create_task(_garbage_session(target, garbage, keys[garbage]))

        def done():
            rec = round_record(db, 1)
            return rec is not None and rec.state.is_terminal

        async def until(pred, timeout, what):
            end = asyncio.get_running_loop().time() + timeout
            while not await asyncio.to_thread(pred):
                procs.check_alive(coord, real)
                assert asyncio.get_running_loop().time() < end, f"timed out waiting for {what}"
                await asyncio.sleep(0.2)

        await until(done, 90, "round 1 to end")
        code, details, tasks = await asyncio.wait_for(garbage_task, 10)
        await until(lambda: clients[3].status is not None, 10, "the oversized stream to end")
        await until(lambda: clients[2].committed, 10, "RoundCommitted at the replaying client")  # sent after the commit
        return ids, devices, clients, (code, details, tasks)

    ids, devices, clients, garbage_result = asyncio.run(main())
    wrong_len, wrong_round, later_stage, replay, oversized, garbage = ids
    rec = round_record(db, 1)
    assert rec.state.value == "committed", rec
    assert {k: set(v) for k, v in rec.dropouts.items()} == {
        "advertise_keys": {later_stage, garbage},
        "share_keys": {wrong_round},
        "masked_input": {wrong_len, oversized},
    }, rec.dropouts
    counted = check_exact_aggregate(rec, [state], extra={replay: devices[replay].encoded})
    assert replay in counted and len(counted) == honest + 1

    # what each offender was told
    assert devices[wrong_len].aborted == [P.ABORT_REASON_PROTOCOL_VIOLATION]
    assert devices[later_stage].aborted == [P.ABORT_REASON_PROTOCOL_VIOLATION]
    assert devices[wrong_round].aborted == [P.ABORT_REASON_DEADLINE_MISSED]
    assert devices[replay].aborted == []
    assert clients[2].committed and clients[2].committed[0].contributors == honest + 1
    assert clients[3].status == grpc.StatusCode.RESOURCE_EXHAUSTED
    code, details, tasks = garbage_result
    assert tasks == 1 and code == grpc.StatusCode.INVALID_ARGUMENT and "malformed" in details

    # ... and the log line each left
    log = coord.log()
    dropped = {e["device"]: e for e in events(log, "device_dropped")}
    assert dropped[str(wrong_len)]["reason"] == "protocol_violation" and "MaskedInput" in dropped[str(wrong_len)]["detail"]
    assert dropped[str(later_stage)]["reason"] == "protocol_violation"
    assert "during advertise_keys" in dropped[str(later_stage)]["detail"]
    assert dropped[str(wrong_round)]["reason"] == "deadline_missed"
    discarded = events(log, "message_discarded")
    assert any(e["device"] == str(wrong_round) and e["why"] == "another round or session" for e in discarded)
    assert any(e["device"] == str(replay) and e["why"] == "replay of an earlier stage" for e in discarded)
    lost = {e["device"]: e for e in events(log, "device_lost")}
    assert str(oversized) in lost and lost[str(oversized)]["stage"] == "masked_input"
    # the transport refused the oversized message (the sender got RESOURCE_EXHAUSTED); the coordinator
    # sees its stream end, and says that this is one of the possible causes
    assert any("receive limit" in e.get("why", "") for e in events(log, "session_closed"))
    assert str(garbage) in lost and lost[str(garbage)]["stage"] == "advertise_keys"
    assert any("malformed" in e.get("why", "") for e in events(log, "session_violation"))
    assert any("malformed" in e.get("why", "") for e in events(log, "session_refused"))

    # the coordinator is still up and serving
    assert health_status(port) == "SERVING"
    with grpc.insecure_channel(target) as ch:
        resp = _signed_enroll(coordinator_service_pb2_grpc.CoordinatorServiceStub(ch), "late")
        assert resp.devices[0].device_id > 0
    procs.check_alive(coord, real)


TOKEN = "integration-token-0123456789"


def _rpc_code(fn) -> grpc.StatusCode:
    try:
        fn()
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def _enroll_request(name: str) -> enrollment_pb2.EnrollRequest:
    """Unsigned (for calls the transport refuses before the coordinator reads them)."""
    return enrollment_pb2.EnrollRequest(client_name=name, devices=[
        enrollment_pb2.DeviceEnrollment(local_id=f"{name}-1", identity_public_key=bytes(range(32)))])


def _signed_enroll(stub, name: str, metadata: tuple = ()) -> enrollment_pb2.EnrollResponse:
    """Enrol one device proving possession of its key over a fresh challenge."""
    challenge = stub.EnrollChallenge(enrollment_pb2.EnrollChallengeRequest(), timeout=10, metadata=metadata).challenge
    key = fakes.identity_private(90_000 + sum(name.encode()))
    return stub.Enroll(signed_enroll_request(challenge, name, [(f"{name}-1", key)]), timeout=10, metadata=metadata)


def test_token_auth_refuses_unauthenticated_peers(procs: Processes, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'coordinator.db'}"
    port = free_port()
    target = f"{LOOPBACK}:{port}"
    coord = procs.start("coordinator", coordinator_args(
        port, db, auth="token", model="synthetic", model_params={"vector_length": L}, cohort_size=3,
        cohort_minimum=3, over_selection=0.0, rounds=1, selection_deadline=5, secagg_graph="full",
        secagg_threshold="majority", dp_mode="none", debug_record_sums=True,
    ), env={"FEDMASK_AUTH__TOKEN": TOKEN})
    wait_serving(port, coord)  # the health service needs no token
    bad = procs.start("client-bad", client_args(port, "1-2", tmp_path / "bad", dataset="synthetic", threads=1),
                      env={"FEDMASK_TOKEN": "not-the-token-at-all"})
    with grpc.insecure_channel(target) as ch:
        stub = coordinator_service_pb2_grpc.CoordinatorServiceStub(ch)
        assert _rpc_code(lambda: stub.Enroll(_enroll_request("none"), timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
        assert _rpc_code(lambda: stub.Enroll(_enroll_request("bad"), timeout=10,
                                             metadata=(("authorization", "Bearer wrong-token-wrong-token"),))
                         ) == grpc.StatusCode.UNAUTHENTICATED

        def session_without_token():
            hello = session_pb2.ClientMessage(hello=session_pb2.Hello(client_name="x", available_device_ids=[1]))
            for _ in stub.Session(iter([hello]), timeout=10):
                pass

        assert _rpc_code(session_without_token) == grpc.StatusCode.UNAUTHENTICATED
        ok = _signed_enroll(stub, "good", metadata=(("authorization", f"Bearer {TOKEN}"),))
        assert ok.devices[0].device_id > 0
    assert bad.wait(60) == 2  # refused credentials are fatal for an edge client
    assert "refused our credentials" in bad.log()
    good = procs.start("client", client_args(port, "1-3", tmp_path / "good", dataset="synthetic",
                                             debug_record_inputs=True, threads=1), env={"FEDMASK_TOKEN": TOKEN})
    coord.wait(90)  # --rounds 1
    assert coord.returncode == 0, coord.tail()
    (rec,) = terminal_rounds(db)
    assert rec.state.value == "committed"
    check_exact_aggregate(rec, [tmp_path / "good"])
    refused = events(coord.log(), "unauthenticated")
    assert len(refused) >= 4 and all(e["method"].startswith("/fedmask.v1.CoordinatorService/") for e in refused)
    assert TOKEN not in coord.log() and "not-the-token-at-all" not in coord.log()
    procs.check_alive(good)


def test_mtls_refuses_peers_without_a_device_certificate(procs: Processes, tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    certs = procs.start("certs", ["certs", "init", str(pki), "--devices", "2"])
    assert certs.wait(60) == 0, certs.tail()
    ca = (pki / "ca.pem").read_bytes()
    dev_cert, dev_key = pki / "devices" / "device-0001.pem", pki / "devices" / "device-0001.key"
    db = f"sqlite:///{tmp_path / 'coordinator.db'}"
    port = free_port()
    target = f"{LOOPBACK}:{port}"
    coord = procs.start("coordinator", coordinator_args(
        port, db, auth="mtls", tls_cert=pki / "coordinator.pem", tls_key=pki / "coordinator.key",
        tls_client_ca=pki / "ca.pem", require_client_cert=True,
        model="synthetic", model_params={"vector_length": L}, cohort_size=3, cohort_minimum=3, over_selection=0.0,
        rounds=1, selection_deadline=5, secagg_graph="full", secagg_threshold="majority", dp_mode="none",
        debug_record_sums=True,
    ))
    with_cert = grpc.ssl_channel_credentials(root_certificates=ca, private_key=dev_key.read_bytes(),
                                             certificate_chain=dev_cert.read_bytes())
    wait_serving(port, coord, credentials=with_cert)

    def enroll_with(creds) -> grpc.StatusCode:
        ch = grpc.secure_channel(target, creds) if creds is not None else grpc.insecure_channel(target)
        with ch:
            return _rpc_code(lambda: _signed_enroll(coordinator_service_pb2_grpc.CoordinatorServiceStub(ch), "mtls"))

    # no client certificate: the handshake fails before any RPC runs
    assert enroll_with(grpc.ssl_channel_credentials(root_certificates=ca)) == grpc.StatusCode.UNAVAILABLE
    assert enroll_with(None) == grpc.StatusCode.UNAVAILABLE  # plaintext against a TLS port
    assert health_status(port) is None and health_status(port, credentials=grpc.ssl_channel_credentials(ca)) is None
    # gRPC's TLS layer logs each refused handshake (no application code runs for them)
    wait_until(lambda: "PEER_DID_NOT_RETURN_A_CERTIFICATE" in coord.log(), 10, what="the handshake failure log line")
    # a device certificate of the federation CA: accepted
    assert enroll_with(with_cert) == grpc.StatusCode.OK
    client = procs.start("client", client_args(
        port, "1-3", tmp_path / "client", dataset="synthetic", debug_record_inputs=True, threads=1,
        tls_ca=pki / "ca.pem", tls_cert=dev_cert, tls_key=dev_key,
    ))
    coord.wait(90)
    assert coord.returncode == 0, coord.tail()
    (rec,) = terminal_rounds(db)
    assert rec.state.value == "committed"
    check_exact_aggregate(rec, [tmp_path / "client"])
    procs.check_alive(client)
