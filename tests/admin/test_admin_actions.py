"""Operator actions through the admin service (pause, resume, abort,
rollback) reach the coordinator's admin listener with the token's name as
the operator, and show in the audit log read back from the store; a garbage
body is a 422 problem; refusals are problems. Also: the admin service with
its coordinator down, and with a store that does not exist."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from admin_harness import (
    World,
    admin_server,
    admin_settings,
    database,
    fill_store,
    free_port,
    headers,
    world,
)

from admin.app import create_app
from admin.settings import Role
from coordinator.store import StoreError, open_store

O, V = Role.OPERATOR, Role.VIEWER
PROBLEM = "application/problem+json"


@pytest.fixture(params=["sqlite", "postgresql"])
def w(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    with database(request.param, tmp_path, request) as url, world(request.param, url) as running:
        yield running


def post(w: World, path: str, body: object = None, role: Role = O) -> httpx.Response:
    return w.http.post(path, headers=headers(role), json=body)


def test_pause_resume_abort_and_rollback_are_relayed_and_audited(w: World) -> None:
    r = post(w, "/v1/federation/pause", {"reason": "maintenance"})
    assert r.status_code == 200, r.text
    assert r.json()["changed"] is True and r.json()["state"]["paused"] is True
    again = post(w, "/v1/federation/pause").json()
    assert again["changed"] is False
    assert w.http.get("/v1/federation", headers=headers(V)).json()["phase"] == "masked_input"
    assert post(w, "/v1/federation/resume").json()["state"]["paused"] is False

    aborted = post(w, "/v1/rounds/current/abort", {"reason": "bad cohort"})
    assert aborted.status_code == 200 and aborted.json()["state"]["round"] is None
    refused = post(w, "/v1/rounds/current/abort")
    assert refused.status_code == 409 and refused.headers["content-type"].startswith(PROBLEM)
    assert "no round is running" in refused.json()["detail"]

    target = w.filled.versions[1]
    rolled = post(w, f"/v1/models/{target}/rollback", {"reason": "regression"}).json()
    new = rolled["new_model_version"]
    assert new is not None and rolled["state"]["model_version"] == new
    model = w.http.get(f"/v1/models/{new}", headers=headers(V)).json()
    assert model["parent_version"] == target and model["lineage"][:2] == [new, target]
    assert model["sha256"] == w.store.get_model_version(target).sha256
    missing = post(w, "/v1/models/999/rollback")
    assert missing.status_code == 404 and missing.headers["content-type"].startswith(PROBLEM)

    audit = w.http.get("/v1/audit", headers=headers(V)).json()["items"]
    mine = [(e["operator"], e["action"], e["outcome"].split(":")[0]) for e in audit if e["operator"] == "operator-1"]
    assert mine == [("operator-1", "rollback", "refused"), ("operator-1", "rollback", "ok"),
                    ("operator-1", "abort_round", "refused"), ("operator-1", "abort_round", "ok"),
                    ("operator-1", "resume", "ok"), ("operator-1", "pause", "ok"), ("operator-1", "pause", "ok")]
    assert next(e for e in audit if e["action"] == "pause")["details"] == {"reason": ""}
    page = w.http.get("/v1/audit", params={"limit": 3}, headers=headers(V)).json()
    rest = w.http.get("/v1/audit", params={"cursor": page["next_cursor"]}, headers=headers(V)).json()
    assert [e["id"] for e in page["items"] + rest["items"]] == [e["id"] for e in audit]


#: Bodies that are not an ActionBody: wrong type, not JSON, too long, not an object, not UTF-8.
GARBAGE: list[str | bytes] = ['{"reason": 5}', "not json", '{"reason": "' + "x" * 1025 + '"}', "[1, 2]", b"\xff\xfe"]


def test_a_garbage_body_is_a_4xx_problem_and_nothing_happens(w: World) -> None:
    before = len(w.store.list_audit(limit=100).items)
    for body in GARBAGE:
        r = w.http.post("/v1/federation/pause", content=body, headers={**headers(O), "content-type": "application/json"})
        assert r.status_code in (400, 422) and r.headers["content-type"].startswith(PROBLEM), (body, r.text)
        if r.status_code == 422:
            assert r.json()["invalid_params"]
    assert len(w.store.list_audit(limit=100).items) == before
    assert w.coordinator.servicer.paused is False
    assert w.http.get("/v1/rounds", headers=headers(V)).status_code == 200  # and the service goes on


def test_without_the_coordinator_history_still_answers_and_live_routes_are_503(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fedmask.db'}"
    store = open_store(url)
    filled = fill_store(store)
    try:
        with admin_server(admin_settings(url, free_port())) as base:  # nothing listens on that port
            ready = httpx.get(base + "/readyz")
            assert ready.status_code == 503 and ready.json() == {
                "ready": False, "store": True, "coordinator": False, "detail": ["coordinator: UNAVAILABLE"]}
            f = httpx.get(base + "/v1/federation", headers=headers(V)).json()
            assert f["coordinator_reachable"] is False and f["phase"] is None and f["devices_connected"] is None
            assert f["rounds_committed"] == len(filled.committed)
            assert len(httpx.get(base + "/v1/rounds", headers=headers(V)).json()["items"]) == 8
            assert httpx.get(base + "/v1/privacy", headers=headers(V)).json()["exhausted"] is None
            for path in ("/v1/rounds/current", "/v1/events", "/v1/users/alice/recommendations"):
                role = Role.RECOMMENDER if "recommendations" in path else V
                r = httpx.get(base + path, headers=headers(role), timeout=20)
                assert r.status_code == 503 and r.headers["content-type"].startswith(PROBLEM), (path, r.text)
                assert int(r.headers["retry-after"]) >= 1
    finally:
        store.close()


def test_a_missing_sqlite_store_is_refused_and_never_created(tmp_path: Path) -> None:
    path = tmp_path / "absent.db"
    with pytest.raises(StoreError, match="no store"):
        create_app(admin_settings(f"sqlite:///{path}", free_port()))
    assert not path.exists()
