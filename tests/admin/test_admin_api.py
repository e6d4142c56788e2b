"""Every route of the admin service over a real store (SQLite and
PostgreSQL, filled through the store API), served by uvicorn, with the
live routes going to a real gRPC server that implements CoordinatorAdmin
(admin_harness.FakeCoordinatorAdmin): the right answer, no token, wrong
role, and the errors as problem documents."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from admin_harness import (
    ANSWERS,
    N_ITEMS,
    NOT_CONNECTED,
    REFUSES,
    SLOW,
    TOKENS,
    World,
    database,
    headers,
    world,
)

from admin.settings import Role
from coordinator.store.blobs import unpack_parameters
from dpmech import claims
from fedmask_proto.v1 import admin_service_pb2 as pb
from secagg.stages import Stage

V, R, O = Role.VIEWER, Role.RECOMMENDER, Role.OPERATOR
PROBLEM = "application/problem+json"


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def w(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp: Path = tmp_path_factory.mktemp(f"admin-{request.param}")
    with database(request.param, tmp, request) as url, world(request.param, url) as running:
        yield running


def get(w: World, path: str, role: Role | None = V, **params: Any) -> httpx.Response:
    return w.http.get(path, headers=headers(role) if role else {}, params=params)


def assert_problem(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM), r.headers
    body: dict[str, Any] = r.json()
    assert body["status"] == status and body["title"]
    return body


# ------------------------------------------------------------------ access

#: (method, path, roles that may use it); every other role gets 403.
ROUTES: list[tuple[str, str, set[Role]]] = [
    ("GET", "/metrics", {V, O}),
    ("GET", "/openapi.json", {V, R, O}),
    ("GET", "/v1/federation", {V, O}),
    ("GET", "/v1/rounds", {V, O}),
    ("GET", "/v1/rounds/current", {V, O}),
    ("GET", "/v1/rounds/1", {V, O}),
    ("GET", "/v1/models", {V, O}),
    ("GET", "/v1/models/1", {V, O}),
    ("GET", "/v1/models/1/parameters", {V, O}),
    ("GET", "/v1/privacy", {V, O}),
    ("GET", "/v1/audit", {V, O}),
    ("GET", f"/v1/devices/{ANSWERS}/recommendations", {R, O}),
    ("GET", "/v1/users/alice/recommendations", {R, O}),
    # operator actions: only their refusals are exercised here (test_admin_actions.py does the rest)
    ("POST", "/v1/federation/pause", {O}),
    ("POST", "/v1/federation/resume", {O}),
    ("POST", "/v1/rounds/current/abort", {O}),
    ("POST", "/v1/models/1/rollback", {O}),
]


@pytest.mark.parametrize("method,path,allowed", ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_every_route_needs_a_token_of_the_right_role(w: World, method: str, path: str, allowed: set[Role]) -> None:
    for auth in ({}, {"Authorization": "Bearer not-a-known-token-" + "y" * 20}, {"Authorization": "Basic abc"}):
        r = w.http.request(method, path, headers=auth)
        body = assert_problem(r, 401)
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert "token" in body["detail"]
    for role in set(Role) - allowed:
        assert_problem(w.http.request(method, path, headers=headers(role)), 403)
    if method == "GET":
        for role in allowed:
            r = w.http.get(path, headers=headers(role))
            assert r.status_code == 200, (role, r.text)


def test_health_and_readiness_are_open(w: World) -> None:
    assert get(w, "/healthz", None).json() == {"status": "ok"}
    ready = get(w, "/readyz", None)
    assert ready.status_code == 200 and ready.json()["ready"] is True


def test_tokens_never_appear_in_answers_or_metrics(w: World) -> None:
    get(w, "/v1/rounds", R)
    text = get(w, "/metrics").text + json.dumps(get(w, "/v1/audit").json())
    assert not any(t in text for t in TOKENS.values())


def test_unknown_paths_and_methods_are_problems(w: World) -> None:
    assert "no route" in assert_problem(get(w, "/v1/nothing-here"), 404)["detail"]
    assert_problem(w.http.delete("/v1/rounds", headers=headers(V)), 405)


# -------------------------------------------------------------- federation


def test_federation_overview(w: World) -> None:
    f = get(w, "/v1/federation").json()
    assert f["model_name"] == "fedrap"
    assert f["current_version"] == w.filled.versions[-1]
    assert (f["rounds_committed"], f["rounds_aborted"], f["rounds_running"]) == (
        len(w.filled.committed), len(w.filled.aborted), 1)
    assert (f["devices_enrolled"], f["devices_revoked"], f["devices_connected"]) == (12, 1, 9)
    assert f["phase"] == "masked_input" and f["coordinator_reachable"] is True
    assert f["epsilon_budget"] == 50.0 and f["epsilon_spent"] == pytest.approx(sum(0.5 + i for i in (0, 1, 3, 4, 6)))
    p = get(w, "/v1/privacy").json()
    assert (f["delta"], f["protects"], f["privacy_statement"], f["production_plan"]) == (
        1e-5, "one device, all of its data", p["statement"], p["production_plan"])
    assert all(r["delta"] == (1e-5 if r["epsilon"] is not None else None) for r in get(w, "/v1/rounds").json()["items"])


def test_the_stage_strip_shows_every_stage_the_protocol_has(w: World) -> None:
    """The dashboard's stage strip draws the stages /v1/federation lists:
    every secagg Stage in protocol order (the share check included), then
    aggregating; the served script spells no stage list of its own."""
    f = get(w, "/v1/federation").json()
    assert f["round_stages"] == [*(s.value for s in Stage), "aggregating"]
    assert "share_check" in f["round_stages"]
    script = w.http.get("/static/dashboard.js")
    assert script.status_code == 200
    assert "stages = f.round_stages" in script.text
    # a list of the stages would start with the first one
    assert f'"{Stage.ADVERTISE_KEYS.value}"' not in script.text


# ------------------------------------------------------------------ rounds


def test_rounds_newest_first_and_paged_by_cursor(w: World) -> None:
    everything = get(w, "/v1/rounds").json()
    numbers = [r["number"] for r in everything["items"]]
    assert numbers == sorted(w.filled.committed + w.filled.aborted + [w.filled.running], reverse=True)
    assert everything["next_cursor"] is None
    walked: list[int] = []
    cursor = None
    while True:
        page = get(w, "/v1/rounds", limit=3, **({"cursor": cursor} if cursor else {})).json()
        assert len(page["items"]) <= 3
        walked += [r["number"] for r in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert walked == numbers


def test_rounds_filtered_by_outcome(w: World) -> None:
    for outcome, expected in (("committed", w.filled.committed), ("aborted", w.filled.aborted),
                              ("running", [w.filled.running])):
        walked: list[int] = []
        cursor = None
        while True:
            page = get(w, "/v1/rounds", outcome=outcome, limit=2, **({"cursor": cursor} if cursor else {})).json()
            assert all(r["outcome"] == outcome for r in page["items"])
            walked += [r["number"] for r in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert walked == sorted(expected, reverse=True)
    assert_problem(get(w, "/v1/rounds", outcome="won"), 422)


@pytest.mark.parametrize("cursor", ["garbage!", "R0", "R" + "f" * 16, "M3", "x" * 201, ""])
def test_a_malformed_cursor_is_a_422_problem(w: World, cursor: str) -> None:
    # R0: bound 0; R + 16 hex digits: out of range; M3: a models cursor on rounds
    body = assert_problem(get(w, "/v1/rounds", cursor=cursor), 422)
    assert body["invalid_params"][0]["name"].endswith("cursor")


def test_round_detail(w: World) -> None:
    n = w.filled.committed[1]
    d = get(w, f"/v1/rounds/{n}").json()
    assert d["outcome"] == "committed" and d["cohort_size"] == 10 and d["contributors"] == 8
    stages = {s["stage"]: s for s in d["stages"]}
    assert [s["stage"] for s in d["stages"]] == ["selected", "advertise_keys", "share_keys", "masked_input",
                                                  "unmasking"]
    assert (stages["share_keys"]["survivors"], stages["share_keys"]["dropouts"], stages["share_keys"]["seconds"]) \
        == (9, 1, 0.25)
    assert stages["masked_input"]["dropouts"] == 1 and d["dropout_ids"] == {"share_keys": [10], "masked_input": [9]}
    assert d["validation"] == {"val_sampled_hr@10": pytest.approx(0.2)}
    assert d["model_version"] == w.filled.versions[2] and d["base_model_version"] == w.filled.versions[1]
    assert d["epsilon"] == pytest.approx(0.5 + 1.5) and d["epsilon_round"] == pytest.approx(1.5)
    assert d["seconds"] == pytest.approx(3.0)
    aborted = get(w, f"/v1/rounds/{w.filled.aborted[0]}").json()
    assert aborted["outcome"] == "aborted" and aborted["abort_reason"] == "too_few_survivors"
    assert aborted["model_version"] is None and aborted["epsilon"] is None


def test_unknown_and_bad_round_numbers(w: World) -> None:
    assert "no round 999" in assert_problem(get(w, "/v1/rounds/999"), 404)["detail"]
    assert_problem(get(w, "/v1/rounds/0"), 422)
    assert_problem(get(w, "/v1/rounds/abc"), 422)


def test_current_round_from_the_coordinator(w: World) -> None:
    c = get(w, "/v1/rounds/current").json()
    r = c["round"]
    assert r["number"] == w.filled.running and r["stage"] == "masked_input" and r["threshold"] == 7
    assert [(s["stage"], s["survivors"]) for s in r["stages"]] == [("advertise_keys", 10), ("share_keys", 9),
                                                                   ("masked_input", 4)]
    assert r["stages"][-1]["pending"] == 5 and r["stages"][-1]["deadline"] is not None
    assert r["stages"][1]["seconds"] == 0.5


# ------------------------------------------------------------------ models


def test_models_lineage_and_parameters(w: World) -> None:
    listing = get(w, "/v1/models").json()
    assert [m["version"] for m in listing["items"]] == sorted(w.filled.versions, reverse=True)
    latest = get(w, f"/v1/models/{w.filled.versions[-1]}").json()
    assert latest["round_number"] == w.filled.committed[-1]
    assert latest["lineage"] == list(reversed(w.filled.versions))
    assert latest["parent_version"] == w.filled.versions[-2]
    first = get(w, f"/v1/models/{w.filled.versions[0]}").json()
    assert first["round_number"] is None and first["parent_version"] is None
    r = get(w, latest["parameters_url"])
    assert r.headers["content-type"] == "application/octet-stream" and r.headers["etag"] == f'"{latest["sha256"]}"'
    params = unpack_parameters(r.content)
    stored = unpack_parameters(w.store.get_model_version(latest["version"]).parameters)
    np.testing.assert_array_equal(params["item_table"], stored["item_table"])
    with np.load(io.BytesIO(r.content), allow_pickle=False) as archive:
        assert archive.files == ["item_table"]
    assert_problem(get(w, "/v1/models/999"), 404)
    assert_problem(get(w, "/v1/models/999/parameters"), 404)
    page = get(w, "/v1/models", limit=2).json()
    rest = get(w, "/v1/models", cursor=page["next_cursor"]).json()
    assert [m["version"] for m in page["items"] + rest["items"]] == sorted(w.filled.versions, reverse=True)


# ----------------------------------------------------------------- privacy


def test_privacy_ledger_and_budget(w: World) -> None:
    p = get(w, "/v1/privacy").json()
    assert [e["round_number"] for e in p["ledger"]] == w.filled.committed
    assert all(e["counted_devices"] == 8 and e["noise_multiplier"] == 0.9 for e in p["ledger"])
    spent = sum(0.5 + i for i in (0, 1, 3, 4, 6))
    assert p["epsilon_spent"] == pytest.approx(spent) and p["delta"] == 1e-5
    assert p["epsilon_budget"] == 50.0 and p["epsilon_remaining"] == pytest.approx(50.0 - spent)
    assert p["exhausted"] is False
    # what the epsilon means: its delta, the unit, no sampling assumed, and the production-size line
    assert p["protects"] == "one device, all of its data" and p["amplification_by_sampling"] is False
    assert p["statement"].startswith(f"epsilon {claims.epsilon_text(spent, 4)} at delta 1e-05 over 5 rounds protects "
                                     "one device, all of its data; no amplification by sampling")
    line = claims.production_line(0.9, 8)  # the latest round's multiplier and counted devices
    assert line is not None and p["production_plan"] == line.as_dict()
    assert p["production_plan"]["noise_multiplier"] == pytest.approx(0.9 * 1000 / 8)
    assert p["production_plan"]["text"].startswith("At 1,000,000 devices, cohorts of 1,000, 100 rounds")


def test_audit_log_from_the_store(w: World) -> None:
    items = get(w, "/v1/audit").json()["items"]
    assert any(e["operator"] == "ops" and e["action"] == "pause" and e["outcome"] == "ok" for e in items)


# ------------------------------------------------------------------- top-k


def test_top_k_by_device_and_by_user(w: World) -> None:
    r = get(w, f"/v1/devices/{ANSWERS}/recommendations", R, k=5, exclude_seen="false").json()
    assert r["computed_on"] == "device" and r["device_id"] == ANSWERS and r["model_version"] == w.filled.versions[-1]
    assert [i["rank"] for i in r["items"]] == [1, 2, 3, 4, 5]
    assert r["items"][0] == {"item_id": "100", "title": "Movie 0", "rank": 1, "item_index": 0}  # no score (D84)
    assert r["seen_excluded"] is True  # asked for seen items; the device's policy left them out, and says so
    assert r["latency_ms"] == pytest.approx(3.0) and r["total_ms"] >= 0 and r["recommendation_id"]
    sent = w.coordinator.servicer.topk_requests[-1]
    assert (sent.device_id, sent.k, sent.exclude_seen) == (ANSWERS, 5, False)
    u = get(w, "/v1/users/alice/recommendations", R).json()
    assert len(u["items"]) == 10 and u["user"] == "alice"
    assert w.coordinator.servicer.topk_requests[-1].user_handle == "alice"
    assert w.coordinator.servicer.topk_requests[-1].exclude_seen is True


def test_top_k_errors(w: World) -> None:
    assert_problem(get(w, "/v1/devices/99/recommendations", R), 404)
    busy = get(w, f"/v1/devices/{NOT_CONNECTED}/recommendations", R)
    assert_problem(busy, 503)
    assert busy.headers["retry-after"] == "3"  # the coordinator's pushback of 3000 ms
    # an unknown handle and an offline one ("bob") answer alike (D84)
    unknown, offline = get(w, "/v1/users/nobody/recommendations", R), get(w, "/v1/users/bob/recommendations", R)
    same = lambda r: {k: v for k, v in assert_problem(r, 503).items() if k != "instance"}  # noqa: E731 - the path
    assert same(unknown) == same(offline)
    assert unknown.headers["retry-after"] == offline.headers["retry-after"] == "2"
    assert_problem(get(w, f"/v1/devices/{SLOW}/recommendations", R), 504)
    assert "does not serve" in assert_problem(get(w, f"/v1/devices/{REFUSES}/recommendations", R), 403)["detail"]
    for k in (0, -1, "ten"):
        assert_problem(get(w, f"/v1/devices/{ANSWERS}/recommendations", R, k=k), 422)
    assert_problem(get(w, f"/v1/devices/{ANSWERS}/recommendations", R, k=N_ITEMS + 1), 422)
    asked = len(w.coordinator.servicer.topk_requests)
    over = assert_problem(get(w, "/v1/users/alice/recommendations", R, k=101), 422)  # the admin's own cap (D84)
    assert over["invalid_params"][0]["name"] == "query.k"
    assert len(w.coordinator.servicer.topk_requests) == asked  # refused before the coordinator is asked
    metrics = get(w, "/metrics").text
    assert 'fedmask_admin_topk_requests_total{status="504"}' in metrics
    assert 'fedmask_admin_topk_requests_total{status="503"}' in metrics
    assert "fedmask_admin_topk_duration_seconds_bucket" in metrics
    assert "alice" not in metrics and 'route="/v1/devices/{device_id}/recommendations"' in metrics


@pytest.mark.parametrize("cap, default_k", [(100, 10), (20, 10), (5, 5)])
def test_the_top_k_cap_is_the_deployments_and_the_document_says_so(cap: int, default_k: int) -> None:
    from admin.app import create_app
    from admin.settings import AdminSettings
    from coordinator.store import InMemoryStore

    doc = create_app(AdminSettings(max_top_k=cap), store=InMemoryStore()).openapi()
    for path in ("/v1/users/{user}/recommendations", "/v1/devices/{device_id}/recommendations"):
        (k,) = [p for p in doc["paths"][path]["get"]["parameters"] if p["name"] == "k"]
        assert (k["schema"]["maximum"], k["schema"]["default"]) == (cap, default_k)
    item = doc["components"]["schemas"]["RecommendedItem"]["properties"]
    assert "score" not in item and "seen_excluded" in doc["components"]["schemas"]["Recommendations"]["properties"]


# ------------------------------------------------------------------ events


def test_events_relay_the_coordinator_stream_in_order(w: World) -> None:
    frames: list[tuple[str, dict[str, Any]]] = []
    opened = threading.Event()

    def read() -> None:
        with httpx.stream("GET", w.base + "/v1/events", headers=headers(V), timeout=20) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            event = ""
            for line in r.iter_lines():
                if line.startswith("event: "):
                    event = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    frames.append((event, json.loads(line.removeprefix("data: "))))
                    opened.set()
                    if event == "committed":
                        return

    reader = threading.Thread(target=read)
    reader.start()
    assert opened.wait(10)
    stages = [pb.ROUND_STAGE_UNMASKING, pb.ROUND_STAGE_AGGREGATING]
    for stage in stages:
        w.coordinator.publish(pb.AdminEvent(stage_changed=pb.StageChanged(round_number=w.filled.running,
                                                                          stage=stage, threshold=7)))
    w.coordinator.publish(pb.AdminEvent(round_committed=pb.RoundCommittedEvent(round_number=w.filled.running,
                                                                               new_model_version=99)))
    reader.join(10)
    assert not reader.is_alive()
    assert [e for e, _ in frames] == ["snapshot", "stage", "stage", "committed"]
    assert frames[0][1]["round"]["stage"] == "masked_input"
    assert [d["stage"] for _, d in frames[1:3]] == ["unmasking", "aggregating"]
    seqs = [d["sequence"] for _, d in frames[1:]]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    assert frames[3][1]["new_model_version"] == "99"  # uint64 as a JSON string (proto3 JSON mapping)
