"""`fedmask admin` as a real process over a real federation: a `fedmask
coordinator` process with its admin listener, edge-client processes
training FedRAP on the synthetic dataset, and the admin service reading the
coordinator's SQLite store and calling its admin listener.

Checked over REST: readiness; the SSE stream delivers every stage of a round
in protocol order and then its commit; the rounds history and one round's
detail; the top-k of a user equals what the device's own model gives
(recomputed independently from the client's state directory); a device that
refuses recommendations is a 403, an unknown user a 503 (as an offline one,
D84), a bad k a 422; the answer carries ranks, no scores; a
pause through the API lands in the coordinator's audit log with the API
token's name; and the rounds go on after all that bad input.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from admin_federation import SEED, auth, start
from integration_harness import Processes, terminal_rounds, wait_until

from edge_client.app import ClientConfig, EdgeClient
from edge_client.queries import top_k

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

K = 5
STAGES = ["advertise_keys", "share_keys", "share_check", "masked_input", "unmasking", "aggregating"]


def read_events(base: str, frames: list[tuple[str, dict[str, Any]]], stop: threading.Event) -> None:
    """Collect SSE frames until `stop` is set and a frame arrives (or the stream ends)."""
    with httpx.stream("GET", base + "/v1/events", headers=auth("viewer"), timeout=60) as r:
        assert r.status_code == 200, r.read()
        event = ""
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: "):
                frames.append((event, json.loads(line.removeprefix("data: "))))
                if stop.is_set():
                    return


def first_whole_round(frames: list[tuple[str, dict[str, Any]]]) -> tuple[int, list[str]] | None:
    """(number, stages seen in order) of the first round whose opening stage
    and commit are both in `frames`, or None."""
    opened: dict[int, list[str]] = {}
    for event, data in frames:
        if event == "stage":
            n = int(data["round_number"])
            if data["stage"] == "advertise_keys" and n not in opened:
                opened[n] = []
            if n in opened:
                opened[n].append(data["stage"])
        elif event == "committed" and int(data["round_number"]) in opened:
            return int(data["round_number"]), opened[int(data["round_number"])]
    return None


def test_the_admin_service_over_a_real_federation(procs: Processes, tmp_path: Path) -> None:
    fed = start(procs, tmp_path)
    db, base, everyone, dirs = fed.db, fed.base, fed.everyone, fed.state_dirs
    frames: list[tuple[str, dict[str, Any]]] = []
    stop = threading.Event()
    reader = threading.Thread(target=read_events, args=(base, frames, stop), daemon=True)
    reader.start()
    whole = wait_until(lambda: first_whole_round(frames), 150, what="a whole round on the event stream",
                       watch=everyone, step=0.2)
    stop.set()
    number, stages = whole
    assert frames[0][0] == "snapshot"
    assert stages == STAGES, stages  # every stage, in protocol order (no consistency check in this mode)

    with httpx.Client(base_url=base, timeout=60) as http:
        f = http.get("/v1/federation", headers=auth("viewer")).json()
        assert f["coordinator_reachable"] is True and f["model_name"] == "fedrap"
        assert f["devices_enrolled"] == 4 and f["devices_connected"] == 4 and f["rounds_committed"] >= 1
        rounds = http.get("/v1/rounds", params={"outcome": "committed"}, headers=auth("viewer")).json()["items"]
        assert number in [r["number"] for r in rounds]
        detail = http.get(f"/v1/rounds/{number}", headers=auth("viewer")).json()
        assert detail["outcome"] == "committed" and detail["contributors"] == 4 and detail["model_version"]
        assert detail["cohort_size"] == 4 and detail["threshold"] == 3  # majority of 4 on the complete graph
        assert [s["stage"] for s in detail["stages"] if s["stage"] in STAGES][:2] == STAGES[:2]

        refused = http.get("/v1/users/user-3/recommendations", params={"k": K}, headers=auth("recommender"))
        assert refused.status_code == 403 and refused.headers["content-type"].startswith("application/problem+json")
        # an unknown handle answers as an offline one (D84)
        assert http.get("/v1/users/user-99/recommendations", headers=auth("recommender")).status_code == 503
        for k in (0, 101, 301):  # k <= 0; k > the deployment's cap of 100; k > the model's 300 items
            bad = http.get("/v1/users/user-1/recommendations", params={"k": k}, headers=auth("recommender"))
            assert bad.status_code == 422, bad.text
        paused = http.post("/v1/federation/pause", json={"reason": "test"}, headers=auth("operator"))
        assert paused.status_code == 200 and paused.json()["state"]["paused"] is True
        audit = http.get("/v1/audit", headers=auth("viewer")).json()["items"]
        assert (audit[0]["operator"], audit[0]["action"], audit[0]["outcome"]) == ("operator-1", "pause", "ok")
        resumed = http.post("/v1/federation/resume", headers=auth("operator")).json()
        assert resumed["state"]["paused"] is False
        done = len(terminal_rounds(db))
        wait_until(lambda: len(terminal_rounds(db)) > done, 120, what="rounds to go on after the bad input",
                   watch=everyone, step=0.2)

        # paused and idle, so the device's model stays what it answers with until it is recomputed below
        http.post("/v1/federation/pause", headers=auth("operator"))
        wait_until(lambda: http.get("/v1/rounds/current", headers=auth("viewer")).json()["round"] is None, 120,
                   what="the running round to end", watch=everyone, step=0.2)
        answer = http.get("/v1/users/user-1/recommendations", params={"k": K, "exclude_seen": "true"},
                          headers=auth("recommender"))
        assert answer.status_code == 200, answer.text
        got = answer.json()
        assert got["computed_on"] == "device" and got["user"] == "user-1" and len(got["items"]) == K
        by_device = http.get(f"/v1/devices/{got['device_id']}/recommendations", params={"k": K},
                             headers=auth("recommender")).json()
        assert [i["item_id"] for i in by_device["items"]] == [i["item_id"] for i in got["items"]]
        metrics = http.get("/metrics", headers=auth("viewer")).text
        assert 'fedmask_admin_topk_requests_total{status="200"}' in metrics
        assert 'fedmask_admin_topk_requests_total{status="403"}' in metrics


    for c in fed.clients:
        assert c.stop() == 0
    # uvicorn shuts down gracefully on SIGTERM and then re-raises the signal: -15 is its clean exit
    assert fed.admin.stop() in (0, -15)
    assert fed.coordinator.stop() == 0

    # the same top-k from the device's own state on disk, mapped to the dataset's ids and titles
    client = EdgeClient(ClientConfig(coordinator="127.0.0.1:1", users="1-2", state_dir=dirs["client-a"],
                                     dataset="synthetic", seed=SEED)).prepare()
    try:
        assert client.trainer is not None
        items, _scores, version = top_k(client.trainer, 1, K, exclude_seen=True)
        x = client.trainer.x
        assert x.item_titles is not None
        assert [i["item_index"] for i in got["items"]] == items
        assert [i["item_id"] for i in got["items"]] == [str(x.raw_item_ids[i]) for i in items]
        assert [i["title"] for i in got["items"]] == [str(x.item_titles[i]) for i in items]
        assert all("score" not in i for i in got["items"]) and got["seen_excluded"] is True  # D84
        assert got["model_version"] == version
    finally:
        client.close()
