"""A recommender token learns a top-k and nothing else (docs/decisions.md D84),
over real processes: a `fedmask coordinator` with its admin listener, two
edge-client processes training FedRAP on the synthetic dataset, and `fedmask
admin` with a recommender token.

The attack: ask for a user's top-k with k the catalogue's size, once with
exclude_seen=false and once with true; the set difference of the two answers
was the user's whole interaction history, and the first answer carried the
device's score of every item. Now the device's policy decides (default: the
seen items always left out, at most 100 items, no scores), the admin service
and the coordinator cap k too, and the two requests recover nothing: both
answers are the same top-k of unseen items. The coordinator here allows k up
to the whole catalogue, so the device's own cap is what holds on its
listener.

Handles: an unknown user handle answers exactly as one whose device is
offline (same status, body, Retry-After and timing class), on the REST API
and on the coordinator's admin listener.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from admin.auth import token_hash
from edge_client.app import ClientConfig, EdgeClient
from fedmask_proto.v1 import admin_service_pb2 as A
from fedmask_proto.v1 import admin_service_pb2_grpc
from integration_harness import (
    LOOPBACK,
    Processes,
    client_args,
    coordinator_args,
    free_port,
    terminal_rounds,
    wait_serving,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

COORDINATOR_TOKEN = "admin-listener-token-for-the-recommender-test"
RECOMMENDER = "recommender-token-" + "r" * 32
SEED = 3
N_ITEMS = 300  # the synthetic dataset's catalogue
CAP = 100  # the default cap on k of the admin service and of a device
VICTIM, OFFLINE, UNKNOWN = "user-1", "user-5", "user-404"


def _seen_items(tmp_path: Path) -> set[int]:
    """Every item the victim rated, as its device holds them (a fresh client on the same dataset and seed)."""
    probe = EdgeClient(ClientConfig(coordinator="127.0.0.1:1", users="1", state_dir=tmp_path / "probe",
                                    dataset="synthetic", seed=SEED)).prepare()
    try:
        assert probe.trainer is not None
        seen = probe.trainer.data.seen(1)
        assert seen is not None
        return {int(i) for i in seen}
    finally:
        probe.close()


def _two_request_attack(http: httpx.Client, user: str) -> tuple[int, list[dict[str, Any]]]:
    """The attacker's k (the catalogue, else the largest the API takes) and
    the two answers, with and without the seen items asked for."""
    for k in (N_ITEMS, CAP):
        answers = [http.get(f"/v1/users/{user}/recommendations", params={"k": k, "exclude_seen": seen})
                   for seen in ("false", "true")]
        if answers[0].status_code == 422:
            continue
        for a in answers:
            assert a.status_code == 200, a.text
        return k, [a.json() for a in answers]
    raise AssertionError("no k accepted")


def _timed(http: httpx.Client, path: str) -> tuple[httpx.Response, float]:
    t0 = time.perf_counter()
    r = http.get(path)
    return r, time.perf_counter() - t0


def test_a_recommender_learns_the_top_k_and_nothing_else(procs: Processes, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'coordinator.db'}"
    port, admin_port, http_port = free_port(), free_port(), free_port()
    coord = procs.start("coordinator", coordinator_args(
        port, db, model="fedrap", model_params={"n_users": 200, "n_items": N_ITEMS, "k": 8, "local_epochs": 1},
        cohort_size=5, cohort_minimum=5, over_selection=0.0, seed=1, round_pause=600,
        selection_deadline=60, training_deadline=60, advertise_keys_deadline=10, share_keys_deadline=10,
        masked_input_deadline=10, unmasking_deadline=10, secagg_graph="full", secagg_threshold="majority",
        dp_mode="none", admin_listen=f"{LOOPBACK}:{admin_port}",
    ), env={"FEDMASK_ADMIN__TOKEN": COORDINATOR_TOKEN,
            "FEDMASK_ADMIN__MAX_TOP_K": str(N_ITEMS)})  # this coordinator lets k reach the whole catalogue
    wait_serving(port, coord)
    clients = [procs.start("client-a", client_args(port, "1-4", tmp_path / "client-a", dataset="synthetic",
                                                   seed=SEED, threads=1)),
               procs.start("client-b", client_args(port, "5", tmp_path / "client-b", dataset="synthetic",
                                                   seed=SEED, threads=1))]
    tokens = [{"name": "app-backend", "role": "recommender", "sha256": token_hash(RECOMMENDER)}]
    admin = procs.start("admin", ["admin", "--listen", f"{LOOPBACK}:{http_port}", "--database-url", db,
                                  "--coordinator", f"{LOOPBACK}:{admin_port}", "--log-level", "WARNING"],
                        env={"FEDMASK_ADMIN_COORDINATOR__TOKEN": COORDINATOR_TOKEN,
                             "FEDMASK_ADMIN_TOKENS": json.dumps(tokens)})
    everyone = [coord, admin, *clients]
    seen = _seen_items(tmp_path)  # while the federation trains
    assert len(seen) > 10
    wait_until(lambda: terminal_rounds(db), 120, what="round 1 to end", watch=everyone, step=0.2)
    (r1,) = terminal_rounds(db)
    assert r1.state.value == "committed", r1
    assert clients[1].stop() == 0  # user-5's device goes offline; its handle stays enrolled
    grpc_auth = (("authorization", f"Bearer {COORDINATOR_TOKEN}"),)

    with httpx.Client(base_url=f"http://{LOOPBACK}:{http_port}", timeout=30,
                      headers={"Authorization": f"Bearer {RECOMMENDER}"}) as http:
        wait_until(lambda: http.get("/readyz").status_code == 200, 60, what="the admin service ready",
                   watch=everyone, step=0.2)

        # --- the two-request attack recovers nothing beyond the top-k
        k, (with_seen, without_seen) = _two_request_attack(http, VICTIM)
        asked = [{i["item_index"] for i in a["items"]} for a in (with_seen, without_seen)]
        recovered = asked[0] - asked[1]
        assert not recovered, (f"k={k}: the set difference recovers {len(recovered)} items, "
                               f"{len(recovered & seen)} of them rated by the user ({len(seen)} rated)")
        assert not (asked[0] | asked[1]) & seen, "a rated item left the device"
        assert k == CAP and len(with_seen["items"]) == len(without_seen["items"]) == CAP
        assert with_seen["items"] == without_seen["items"]  # the same top-k, in the same order
        assert with_seen["seen_excluded"] is True and without_seen["seen_excluded"] is True  # and it says so
        assert all(set(i) == {"item_id", "title", "rank", "item_index"} for i in with_seen["items"])  # no score
        over = http.get(f"/v1/users/{VICTIM}/recommendations", params={"k": CAP + 1})
        assert over.status_code == 422 and "query.k" in over.text

        # --- the device's own cap holds where the coordinator allows more
        with grpc.insecure_channel(f"{LOOPBACK}:{admin_port}") as ch:
            stub = admin_service_pb2_grpc.CoordinatorAdminStub(ch)
            whole = stub.RecommendTopK(A.RecommendTopKRequest(user_handle=VICTIM, k=N_ITEMS, exclude_seen=False),
                                       metadata=grpc_auth, timeout=30)
            assert len(whole.items) == CAP and whole.seen_excluded
            assert [i.item_index for i in whole.items] == [i["item_index"] for i in with_seen["items"]]
            assert all(i.score == 0.0 for i in whole.items)

            # --- unknown and offline handles answer alike on the coordinator's admin listener
            def failure(handle: str) -> tuple[Any, ...]:
                with pytest.raises(grpc.RpcError) as info:
                    stub.RecommendTopK(A.RecommendTopKRequest(user_handle=handle, k=10), metadata=grpc_auth,
                                       timeout=30)
                e: Any = info.value
                return e.code(), e.details(), dict(e.trailing_metadata() or ())

            assert failure(OFFLINE) == failure(UNKNOWN)
            assert failure(UNKNOWN)[0] is grpc.StatusCode.UNAVAILABLE

        # --- and on the REST API: status, body, Retry-After and timing class
        answers: dict[str, list[tuple[httpx.Response, float]]] = {OFFLINE: [], UNKNOWN: []}
        for _ in range(5):
            for handle in answers:
                answers[handle].append(_timed(http, f"/v1/users/{handle}/recommendations?k=10"))
        shapes = set()
        for handle, got in answers.items():
            for r, _s in got:
                body = r.json()
                body.pop("instance")  # the request's own path
                shapes.add((r.status_code, r.headers["content-type"], r.headers.get("retry-after"),
                            json.dumps(body, sort_keys=True)))
        assert len(shapes) == 1, shapes
        ((status, _ctype, retry, _body),) = shapes
        assert status == 503 and retry is not None
        medians = {h: statistics.median(s for _r, s in got) for h, got in answers.items()}
        # neither waits on a device (the admin service would wait up to 5 s): one timing class
        assert max(medians.values()) < 1.0 and abs(medians[OFFLINE] - medians[UNKNOWN]) < 0.25, medians

    assert clients[0].stop() == 0
    assert admin.stop() in (0, -15)  # uvicorn re-raises the SIGTERM it shut down on
    assert coord.stop() == 0
