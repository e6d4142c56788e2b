"""A token holder cannot take over another client's device
(D32), with real processes on 127.0.0.1.

A coordinator in token mode runs two secure rounds with a real edge client
(the victim: users 1-3). Between the rounds an attacker in the test process,
holding the same bearer token and knowing the victim's public identity keys
(as every peer does in active mode), tries what used to take a device over:

- enrolling the victim's public key again: without the private key it
  cannot sign the coordinator's challenge, so the Enroll is refused whole
  (PERMISSION_DENIED naming only the attacker's own local id) and returns no
  device id; without a challenge (a fedmask.v1 client) it is refused too;
- opening a Session that claims the victim's device id in its Hello: its
  proof does not verify, so the Welcome rejects the device NOT_PROVEN, and
  nothing else happens: no displacement, the victim's stream stays up;
- claiming the id again in a CheckIn, with the attacker's stream admitted.

Asserted: the victim's devices contribute to round 2 (the aggregate is
exact over them), the victim opened exactly one session, the coordinator
never displaced a session, and every attacker call got nothing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from edge_client.transport import signed_enroll_request
from fedmask_proto.v1 import coordinator_service_pb2_grpc, enrollment_pb2, session_pb2
from integration_harness import (
    LOOPBACK,
    Processes,
    check_exact_aggregate,
    client_args,
    coordinator_args,
    events,
    free_port,
    open_store_readonly,
    round_record,
    terminal_rounds,
    wait_serving,
    wait_until,
)
from secagg import identity
from secagg.randomness import DeterministicRandom
from wire.possession import session_payload
from wire.protocol import PROTOCOL_VERSION

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

L = 32
TOKEN = "takeover-test-token-0123456789"
BEARER = (("authorization", f"Bearer {TOKEN}"),)


async def _attack(target: str, victim_ids: list[int], victim_keys: list[bytes]) -> dict[str, Any]:
    """Every takeover attempt of a token holder without the victim's keys;
    returns what each one got."""
    mallory = identity.generate_identity(DeterministicRandom(4242, "identity"))
    got: dict[str, Any] = {}
    async with grpc.aio.insecure_channel(target) as ch:
        stub = coordinator_service_pb2_grpc.CoordinatorServiceStub(ch)
        # 1. re-enrol the victim's public key, signing with our own key
        challenge = (await stub.EnrollChallenge(enrollment_pb2.EnrollChallengeRequest(), metadata=BEARER)).challenge
        forged = signed_enroll_request(challenge, "mallory", [("mallory-1", mallory)])
        forged.devices[0].identity_public_key = victim_keys[0]
        try:
            await stub.Enroll(forged, metadata=BEARER)
            got["enroll_forged"] = "OK"
        except grpc.aio.AioRpcError as err:
            got["enroll_forged"] = (err.code(), err.details())
        # 2. the same without a challenge (what a fedmask.v1 client sends)
        bare = enrollment_pb2.EnrollRequest(client_name="mallory", devices=[
            enrollment_pb2.DeviceEnrollment(local_id="mallory-2", identity_public_key=victim_keys[1])])
        try:
            await stub.Enroll(bare, metadata=BEARER)
            got["enroll_bare"] = "OK"
        except grpc.aio.AioRpcError as err:
            got["enroll_bare"] = (err.code(), err.details())
        # 3. a Session claiming the victim's first device, with our signature
        queue: asyncio.Queue[session_pb2.ClientMessage | None] = asyncio.Queue()
        await queue.put(session_pb2.ClientMessage(hello=session_pb2.Hello(
            client_name="mallory", protocol_version=PROTOCOL_VERSION, available_device_ids=[victim_ids[0]])))

        async def requests():
            while (m := await queue.get()) is not None:
                yield m

        call = stub.Session(requests(), metadata=BEARER)
        received: list[session_pb2.ServerMessage] = []
        async for msg in call:
            received.append(msg)
            kind = msg.WhichOneof("message")
            if kind == "challenge":
                nonce = msg.challenge.nonce
                await queue.put(session_pb2.ClientMessage(proof=session_pb2.DeviceProofs(proofs=[
                    session_pb2.DeviceProof(device_id=victim_ids[0],
                                            signature=identity.sign(mallory, session_payload(nonce, victim_ids[0])))])))
            elif kind == "welcome":
                got["welcome"] = msg.welcome
                # 4. the other victim devices in a CheckIn, with proofs by our key
                await queue.put(session_pb2.ClientMessage(check_in=session_pb2.CheckIn(
                    available_device_ids=victim_ids[1:],
                    proofs=[session_pb2.DeviceProof(device_id=d, signature=identity.sign(
                        mallory, session_payload(nonce, d))) for d in victim_ids[1:]])))
            elif kind == "check_in_ack":
                got["check_in_ack"] = msg.check_in_ack
                await asyncio.sleep(1.0)  # stay connected a moment: a displacement would show now
                await queue.put(None)
        got["session_end"] = await call.code()
    return got


def test_a_token_holder_cannot_take_over_another_clients_device(procs: Processes, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'coordinator.db'}"
    port = free_port()
    target = f"{LOOPBACK}:{port}"
    coord = procs.start("coordinator", coordinator_args(
        port, db, auth="token", model="synthetic", model_params={"vector_length": L}, cohort_size=3,
        cohort_minimum=3, over_selection=0.0, allow_consecutive=True, rounds=2, round_pause=6.0,
        selection_deadline=30, secagg_graph="full", secagg_threshold="majority", dp_mode="none",
        debug_record_sums=True,
    ), env={"FEDMASK_AUTH__TOKEN": TOKEN})
    wait_serving(port, coord)
    state = tmp_path / "victim"
    victim = procs.start("victim", client_args(port, "1-3", state, dataset="synthetic", debug_record_inputs=True,
                                               threads=1), env={"FEDMASK_TOKEN": TOKEN})
    wait_until(lambda: (r := round_record(db, 1)) is not None and r.state.is_terminal, 60,
               what="round 1 to end", watch=(coord, victim))
    store = open_store_readonly(db)
    try:
        devices = sorted(store.list_devices(), key=lambda r: r.id)
    finally:
        store.close()
    victim_ids = [r.id for r in devices]
    assert len(victim_ids) == 3

    got = asyncio.run(_attack(target, victim_ids, [r.identity_public_key for r in devices]))

    code, details = got["enroll_forged"]
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert details == "device 'mallory-1' did not prove possession of its identity key"
    code, details = got["enroll_bare"]
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "upgrade the edge client" in details
    welcome = got["welcome"]
    assert list(welcome.admission.accepted_device_ids) == []
    assert [(r.device_id, r.reason) for r in welcome.admission.rejected] == [
        (victim_ids[0], session_pb2.DEVICE_REJECTION_REASON_NOT_PROVEN)]
    ack = got["check_in_ack"]
    assert list(ack.accepted_device_ids) == []
    assert {r.reason for r in ack.rejected} == {session_pb2.DEVICE_REJECTION_REASON_NOT_PROVEN}
    assert got["session_end"] == grpc.StatusCode.OK

    coord.wait(90)  # --rounds 2
    assert coord.returncode == 0, coord.tail()
    rounds = terminal_rounds(db)
    assert [r.state.value for r in rounds] == ["committed", "committed"]
    counted = check_exact_aggregate(rounds[1], [state])
    assert sorted(counted) == victim_ids  # the victim's devices made round 2
    log = coord.log()
    assert events(log, "session_displaced") == []
    assert [e["client"] for e in events(log, "enrolled")].count("mallory") == 0
    assert sum(1 for e in events(log, "session_opened") if e["client"] != "mallory") == 1
    assert victim.log().count("session open with coordinator") == 1
    procs.check_alive(victim)
