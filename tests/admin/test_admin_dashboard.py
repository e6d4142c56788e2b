"""The dashboard in a real headless Chromium (Debian's `chromium` and
`chromium-driver`, which .ci/ensure-chromium installs; selenium drives the
system chromedriver and never downloads a browser or a driver).

The page is opened on the admin service over a filled store and the
in-process CoordinatorAdmin gRPC server; the test signs in with a token,
sees the live stage change twice (events relayed over SSE), sees the rounds
table grow when a round commits, submits the top-k form and sees the
device's items, and pauses the federation.

When chromium is missing the test FAILS under CI (env CI set) and skips
with the reason otherwise (tests/chromium_driver.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from admin_harness import T0, TOKENS, World, database, world
from chromium_driver import chromium, wait_for

from admin.settings import Role
from coordinator.store import NewModelVersion, RoundRecord, RoundState
from fedmask_proto.v1 import admin_service_pb2 as pb


@pytest.fixture
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


@pytest.fixture
def w(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    with database("sqlite", tmp_path, request) as url, world("sqlite", url) as running:
        yield running


def commit_a_round(w: World) -> int:
    """A round that commits while the page is open, written through the store API."""
    store = w.store
    n = store.next_round_number()
    start = T0 + timedelta(hours=2)
    store.commit_round(
        RoundRecord(number=n, state=RoundState.COMMITTED, started_at=start, ended_at=start + timedelta(seconds=4),
                    cohort_size=10, base_model_version=w.filled.versions[-1],
                    metrics={"contributors": 9.0, "val_sampled_hr@10": 0.9}),
        NewModelVersion(model_name="fedrap", parameters=store.get_model_version(w.filled.versions[-1]).parameters),
        None)
    return n


def test_the_dashboard_shows_the_live_federation_and_answers_top_k(w: World, browser: Any,
                                                                    tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    d = browser
    d.get(w.base + "/")
    assert d.find_element(By.ID, "app").is_displayed() is False
    d.find_element(By.ID, "token-input").send_keys(TOKENS[Role.OPERATOR])
    d.find_element(By.ID, "token-form").submit()

    def active() -> str:
        items = d.find_elements(By.CSS_SELECTOR, "#stage-strip li.active")
        return str(items[0].get_attribute("data-stage")) if items else ""

    wait_for(d, lambda: active() == "masked_input", "the live stage masked_input")
    rows = lambda: d.find_elements(By.CSS_SELECTOR, "#rounds-table tbody tr")  # noqa: E731
    wait_for(d, lambda: len(rows()) == 8, "the rounds table")
    assert rows()[0].get_attribute("data-round") == str(w.filled.running)
    assert d.find_element(By.ID, "phase").text == "masked_input"
    # epsilon with its delta and unit, and the production-size line beside it
    wait_for(d, lambda: "at delta 1e-05" in d.find_element(By.ID, "privacy").text, "epsilon with its delta")
    assert "protects one device, all of its data" in d.find_element(By.ID, "privacy").text
    assert d.find_element(By.ID, "privacy-plan").text.startswith("At 1,000,000 devices, cohorts of 1,000, 100 rounds")
    assert "delta 1e-5" in d.find_element(By.ID, "chart-epsilon-title").text

    w.coordinator.advance(pb.ROUND_STAGE_UNMASKING)
    wait_for(d, lambda: active() == "unmasking", "the stage to change to unmasking")
    w.coordinator.advance(pb.ROUND_STAGE_AGGREGATING)
    wait_for(d, lambda: active() == "aggregating", "the stage to change to aggregating")
    done = [li.get_attribute("data-stage") for li in d.find_elements(By.CSS_SELECTOR, "#stage-strip li.done")]
    assert done == ["advertise_keys", "share_keys", "masked_input", "unmasking"]  # no share or consistency check
    skipped = [li.get_attribute("data-stage") for li in d.find_elements(By.CSS_SELECTOR, "#stage-strip li.skipped")]
    assert skipped == ["share_check", "consistency_check"]

    d.find_element(By.ID, "topk-user").send_keys("alice")
    k = d.find_element(By.ID, "topk-k")
    k.clear()
    k.send_keys("5")
    d.find_element(By.ID, "topk-form").submit()
    items = lambda: d.find_elements(By.CSS_SELECTOR, "#topk-results tbody tr")  # noqa: E731
    wait_for(d, lambda: len(items()) == 5, "the top-k items")
    assert items()[0].text.split()[:3] == ["1", "100", "Movie"]
    assert "computed on device 1" in d.find_element(By.ID, "topk-meta").text

    d.find_element(By.ID, "pause-btn").click()
    wait_for(d, lambda: "pause done" in d.find_element(By.ID, "status-msg").text, "the pause to be confirmed")
    assert w.coordinator.servicer.paused is True
    shot = tmp_path / "dashboard.png"
    d.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    n = commit_a_round(w)
    w.coordinator.publish(pb.AdminEvent(round_committed=pb.RoundCommittedEvent(round_number=n)))
    wait_for(d, lambda: len(rows()) == 9 and rows()[0].get_attribute("data-round") == str(n),
             "the rounds table to grow")
    assert d.find_elements(By.CSS_SELECTOR, "#chart-val polyline")

    assert TOKENS[Role.OPERATOR] not in d.page_source


def test_without_validation_totals_the_chart_says_why(request: pytest.FixtureRequest, tmp_path: Path,
                                                      browser: Any) -> None:
    """Under DP the devices send no metric totals (D36): the validation chart
    says so instead of waiting for data, and the other charts still draw."""
    from selenium.webdriver.common.by import By

    with database("sqlite", tmp_path, request) as url, world("sqlite", url, validation=False) as w:
        d = browser
        d.get(w.base + "/")
        d.find_element(By.ID, "token-input").send_keys(TOKENS[Role.OPERATOR])
        d.find_element(By.ID, "token-form").submit()
        wait_for(d, lambda: len(d.find_elements(By.CSS_SELECTOR, "#rounds-table td.committed")) == 5,
                 "the committed rounds")
        wait_for(d, lambda: "off under DP" in d.find_element(By.ID, "chart-val").text, "the chart's reason")
        assert not d.find_elements(By.CSS_SELECTOR, "#chart-val polyline")
        assert d.find_elements(By.CSS_SELECTOR, "#chart-epsilon polyline")
        assert d.find_element(By.ID, "chart-val-title").text == "Federated validation"
