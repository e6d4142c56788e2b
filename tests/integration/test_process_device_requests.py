"""Top-k queries relayed to devices, with real edge-client processes.

The coordinator runs in the test process (`InProcessCoordinator`: the
server module on its own thread), because the relay is an in-process API
(`DeviceRelay.request_top_k`, what the admin service calls); two edge-client
processes host two FedRAP devices each. After one committed round the test
asks every device for its top-k over the gRPC session stream and checks the
answer against what the device's own trainer computes from its state on
disk once the client has stopped: same items in the same order, no scores,
same model version; the training items left out, also when the request
asked for them (the device's default policy, D84); a device id no client
hosts gets the "not connected" error, and so does a device whose client left.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coordinator.errors import DeviceNotConnected, InvalidArgument, UnknownDevice
from coordinator.settings import CoordinatorSettings
from edge_client.app import ClientConfig, EdgeClient
from edge_client.queries import top_k
from integration_harness import (
    InProcessCoordinator,
    Processes,
    client_args,
    events,
    open_store_readonly,
    terminal_rounds,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

N_ITEMS = 300  # the synthetic dataset: 200 users x 300 items
K = 10
SEED = 3
CLIENTS = {"client-a": "1-2", "client-b": "3-4"}


def _settings(db: str) -> CoordinatorSettings:
    return CoordinatorSettings.load(overrides={
        "listen_address": "127.0.0.1:0",
        "database_url": db,
        "model.name": "fedrap",
        "model.hyperparameters": {"n_users": 200, "n_items": N_ITEMS, "k": 8, "local_epochs": 2},
        "cohort.size": 4, "cohort.minimum": 4, "cohort.over_selection": 0.0, "cohort.allow_consecutive": True,
        "cohort.pause": 600.0,  # one round, then idle: the devices' models stay put while the test asks
        "deadlines.selection": 60, "deadlines.training": 60, "deadlines.advertise_keys": 10,
        "deadlines.share_keys": 10, "deadlines.masked_input": 10, "deadlines.unmasking": 10,
        "secagg.graph": "full", "secagg.threshold": "majority", "dp.mode": "none", "seed": 1,
    })


def _device_ids(state_dir: Path) -> dict[int, int]:
    """user number -> device id, from the client's enrolment record."""
    enrolled = json.loads((state_dir / "enrollment.json").read_text())
    (devices,) = enrolled.values()
    return {int(local_id.removeprefix("user-")): device_id for local_id, device_id in devices.items()}


def test_top_k_is_computed_on_the_device_and_relayed(procs: Processes, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'coordinator.db'}"
    dirs = {name: tmp_path / name for name in CLIENTS}
    answers: dict[tuple[str, int, bool], object] = {}
    with InProcessCoordinator(_settings(db), tmp_path) as coord:
        clients = {name: procs.start(name, client_args(coord.port, users, dirs[name], dataset="synthetic", seed=SEED,
                                                       threads=1))
                   for name, users in CLIENTS.items()}
        wait_until(lambda: terminal_rounds(db), 150, what="round 1 to end", watch=list(clients.values()), step=0.2)
        (r1,) = terminal_rounds(db)
        assert r1.state.value == "committed", r1
        store = open_store_readonly(db)
        try:
            committed = {v.id for v in store.list_model_versions(limit=10).items}
        finally:
            store.close()

        devices = {name: _device_ids(d) for name, d in dirs.items()}
        for name, numbers in devices.items():
            for number, device_id in numbers.items():
                answers[(name, number, True)] = coord.call(
                    lambda c, d=device_id: c.relay.request_top_k(d, K, exclude_seen=True, timeout_s=30))
        name0, (number0, device0) = "client-a", next(iter(devices["client-a"].items()))
        answers[(name0, number0, False)] = coord.call(lambda c: c.relay.request_top_k(device0, K, exclude_seen=False))

        # refused before anything is sent: k outside the catalogue or above the deployment's cap (D84)
        for k in (0, 101, N_ITEMS + 1):
            with pytest.raises(InvalidArgument, match=rf"1\.\.100 \(the model's {N_ITEMS} items"):
                coord.call(lambda c, k=k: c.relay.request_top_k(device0, k))
        # a device id no client hosts (never enrolled)
        with pytest.raises(DeviceNotConnected, match="device 9999 is not connected") as info:
            coord.call(lambda c: c.relay.request_top_k(9999, K))
        assert isinstance(info.value, UnknownDevice)
        # an enrolled device whose client has gone
        assert clients["client-b"].stop() == 0
        wait_until(lambda: events(coord.log(), "session_closed"), 30, what="client-b's session to close")
        device_b = next(iter(devices["client-b"].values()))
        with pytest.raises(DeviceNotConnected, match=f"device {device_b} is not connected: no open session") as info:
            coord.call(lambda c: c.relay.request_top_k(device_b, K))
        assert not isinstance(info.value, UnknownDevice)
        assert clients["client-a"].stop() == 0
        logged = events(coord.log(), "device_request")
        assert sum(e["outcome"] == "ok" for e in logged) == len(answers)

    for (name, number, exclude_seen), answer in answers.items():
        device_id = devices[name][number]
        assert answer.device_id == device_id
        assert len(answer.item_ids) == K and not hasattr(answer, "scores")  # ranks only, no scores (D84)
        # the device's default policy leaves the seen items out, also when the request asked for them
        assert answer.seen_excluded is True, (name, number, exclude_seen)
        # the version the device's model was trained from: the round's base, a committed version
        assert answer.model_version == r1.base_model_version and answer.model_version in committed

    # what each device's own trainer computes from its state on disk (clients stopped)
    for name, d in dirs.items():
        client = EdgeClient(ClientConfig(coordinator="127.0.0.1:1", users=CLIENTS[name], state_dir=d,
                                         dataset="synthetic", seed=SEED)).prepare()
        try:
            for (aname, number, exclude_seen), answer in answers.items():
                if aname != name:
                    continue
                assert client.trainer is not None
                items, _scores, version = top_k(client.trainer, number, K, exclude_seen=True)
                assert list(answer.item_ids) == items, (name, number, exclude_seen)
                assert answer.model_version == version
                hosted = next(h for h in client.hosted if h.number == number)
                arrays, _meta = hosted.store.load_data()
                assert not set(answer.item_ids) & set(arrays["imp_train"].tolist())
        finally:
            client.close()
