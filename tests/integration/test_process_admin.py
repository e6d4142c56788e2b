"""The admin listener of a real `fedmask coordinator` process, with real
edge-client processes training FedRAP on the synthetic dataset.

The admin token comes from the environment (FEDMASK_ADMIN__TOKEN), never a
flag. After one committed round the test asks for top-k by user handle
over the admin listener and checks the answer against what the device's
own trainer computes from its state on disk (items in rank order, the
dataset's item ids and titles; no scores); a client started with
--no-serve-recommendations is refused with PERMISSION_DENIED, an unknown
user handle with UNAVAILABLE (as an offline one); the admin token is refused on the device
listener; a pause is written to the store's audit log; and the process's
Prometheus endpoint counts the round and the top-k requests.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from edge_client.app import ClientConfig, EdgeClient
from edge_client.queries import top_k
from fedmask_proto.v1 import admin_service_pb2 as A
from fedmask_proto.v1 import admin_service_pb2_grpc, coordinator_service_pb2_grpc, enrollment_pb2
from integration_harness import (
    LOOPBACK,
    Processes,
    client_args,
    coordinator_args,
    free_port,
    open_store_readonly,
    terminal_rounds,
    wait_serving,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TOKEN = "admin-token-for-the-process-test-0123"
SEED = 3
K = 5


def _metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples by (name, labels), less the `replica` label every one carries (one replica's name, D94)."""
    text = urllib.request.urlopen(f"http://{LOOPBACK}:{port}/metrics", timeout=5).read().decode()
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    assert len({s.labels.get("replica") for s in samples}) == 1 and samples[0].labels["replica"], samples[:3]
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "replica"))): s.value for s in samples}


def test_admin_listener_of_a_real_coordinator(procs: Processes, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'coordinator.db'}"
    port, admin_port, metrics_port = free_port(), free_port(), free_port()
    coord = procs.start("coordinator", coordinator_args(
        port, db, model="fedrap", model_params={"n_users": 200, "n_items": 300, "k": 8, "local_epochs": 1},
        cohort_size=4, cohort_minimum=4, over_selection=0.0, allow_consecutive=True, seed=1,
        round_pause=600, selection_deadline=60, training_deadline=60, advertise_keys_deadline=10,
        share_keys_deadline=10, masked_input_deadline=10, unmasking_deadline=10,
        secagg_graph="full", secagg_threshold="majority", dp_mode="none",
        admin_listen=f"{LOOPBACK}:{admin_port}", metrics_listen=f"{LOOPBACK}:{metrics_port}",
    ), env={"FEDMASK_ADMIN__TOKEN": TOKEN})
    wait_serving(port, coord)
    dirs = {"client-a": tmp_path / "client-a", "client-b": tmp_path / "client-b"}
    clients = {
        "client-a": procs.start("client-a", client_args(port, "1-2", dirs["client-a"], dataset="synthetic",
                                                        seed=SEED, threads=1)),
        "client-b": procs.start("client-b", client_args(port, "3-4", dirs["client-b"], dataset="synthetic",
                                                        seed=SEED, threads=1, no_serve_recommendations=True)),
    }
    wait_until(lambda: terminal_rounds(db), 150, what="round 1 to end", watch=[coord, *clients.values()], step=0.2)
    (r1,) = terminal_rounds(db)
    assert r1.state.value == "committed", r1
    auth = (("authorization", f"Bearer {TOKEN}"),)

    with grpc.insecure_channel(f"{LOOPBACK}:{admin_port}") as ch:
        admin = admin_service_pb2_grpc.CoordinatorAdminStub(ch)
        with pytest.raises(grpc.RpcError) as info:
            admin.GetLiveState(A.GetLiveStateRequest(), timeout=10)
        assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
        state = admin.GetLiveState(A.GetLiveStateRequest(), metadata=auth, timeout=10)
        assert (state.model_name, state.rounds_committed_since_start) == ("fedrap", 1)
        assert state.devices.enrolled == 4 and state.devices.connected == 4
        answer = admin.RecommendTopK(A.RecommendTopKRequest(user_handle="user-1", k=K, exclude_seen=True),
                                     metadata=auth, timeout=30)
        assert answer.user_handle == "user-1" and len(answer.items) == K
        assert [i.rank for i in answer.items] == list(range(1, K + 1))
        with pytest.raises(grpc.RpcError) as info:
            admin.RecommendTopK(A.RecommendTopKRequest(user_handle="user-3", k=K), metadata=auth, timeout=30)
        assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.RpcError) as info:  # an unknown handle: as an offline one (D84)
            admin.RecommendTopK(A.RecommendTopKRequest(user_handle="user-99", k=K), metadata=auth, timeout=30)
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE
        paused = admin.Pause(A.OperatorRequest(operator="ops", reason="test"), metadata=auth, timeout=10)
        assert paused.changed and paused.state.paused

    with grpc.insecure_channel(f"{LOOPBACK}:{port}") as ch:  # the admin token is no device credential
        with pytest.raises(grpc.RpcError) as info:
            coordinator_service_pb2_grpc.CoordinatorServiceStub(ch).Enroll(enrollment_pb2.EnrollRequest(
                client_name="x", devices=[enrollment_pb2.DeviceEnrollment(local_id="x", identity_public_key=b"\1" * 32)]),
                metadata=auth, timeout=10)
        assert info.value.code() is grpc.StatusCode.PERMISSION_DENIED

    m = _metrics(metrics_port)
    deadline = time.monotonic() + 20  # on a busy machine a client may be reconnecting: give it time
    while m[("fedmask_connected_devices", ())] != 4 and time.monotonic() < deadline:
        time.sleep(0.25)
        m = _metrics(metrics_port)
    assert m[("fedmask_rounds_total", (("outcome", "committed"),))] == 1
    assert m[("fedmask_topk_requests_total", (("status", "ok"),))] == 1
    assert m[("fedmask_topk_requests_total", (("status", "refused"),))] == 1
    assert m[("fedmask_topk_requests_total", (("status", "not_found"),))] == 1
    assert m[("fedmask_paused", ())] == 1 and m[("fedmask_connected_devices", ())] == 4

    store = open_store_readonly(db)
    try:
        (entry,) = store.list_audit().items
        assert (entry.operator, entry.action, entry.outcome) == ("ops", "pause", "ok")
    finally:
        store.close()
    for c in clients.values():
        assert c.stop() == 0
    assert coord.stop() == 0

    # the same top-k from the device's own state on disk, mapped to the dataset's ids and titles
    enrolled = json.loads((dirs["client-a"] / "enrollment.json").read_text())
    assert answer.device_id in next(iter(enrolled.values())).values()
    client = EdgeClient(ClientConfig(coordinator="127.0.0.1:1", users="1-2", state_dir=dirs["client-a"],
                                     dataset="synthetic", seed=SEED)).prepare()
    try:
        assert client.trainer is not None
        items, _scores, version = top_k(client.trainer, 1, K, exclude_seen=True)
        x = client.trainer.x
        titles = x.item_titles
        assert titles is not None
        assert [i.item_index for i in answer.items] == items
        assert [i.item_id for i in answer.items] == [str(x.raw_item_ids[i]) for i in items]
        assert [i.title for i in answer.items] == [str(titles[i]) for i in items]
        assert [i.score for i in answer.items] == [0.0] * K and answer.seen_excluded  # no scores leave (D84)
        assert answer.model_version == version
    finally:
        client.close()
