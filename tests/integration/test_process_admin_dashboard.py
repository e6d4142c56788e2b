"""The dashboard in headless Chromium over a real federation: `fedmask
coordinator` with its admin listener, edge-client processes training FedRAP
and `fedmask admin` as a process (admin_federation.py). The page is opened,
signed in with an operator token; it sees the live stage change at least
twice (every change of the stage strip is recorded in the page by a
MutationObserver, so a stage shorter than a poll is not missed), the rounds
table grow, and the items of a top-k form computed on a device: ranks,
ids and titles without scores, and the seen items left out by the device's
policy even when the form's box asks for them (D84)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from admin_federation import API, start
from chromium_driver import chromium, wait_for
from integration_harness import Processes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

_RECORD_STAGES = """
window.__stages = [];
const strip = document.getElementById("stage-strip");
const note = () => {
  const li = strip.querySelector("li.active");
  const stage = li ? li.dataset.stage : "";
  // a moment with no active stage (the strip re-rendering) is not a stage: recording it
  // would let one stage appear twice in a row once the blanks are filtered out
  if (stage && window.__stages[window.__stages.length - 1] !== stage) window.__stages.push(stage);
};
note();
new MutationObserver(note).observe(strip, {childList: true, subtree: true, attributes: true});
"""


@pytest.fixture
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


def test_the_dashboard_over_a_real_federation(procs: Processes, tmp_path: Path, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    fed = start(procs, tmp_path)
    d = browser
    d.get(fed.base + "/")
    d.execute_script(_RECORD_STAGES)
    d.find_element(By.ID, "token-input").send_keys(API["operator"])
    d.find_element(By.ID, "token-form").submit()

    rows = lambda: d.find_elements(By.CSS_SELECTOR, "#rounds-table tbody tr")  # noqa: E731
    stages = lambda: [s for s in d.execute_script("return window.__stages") if s]  # noqa: E731
    wait_for(d, lambda: len(stages()) >= 3, "the live stage to change at least twice", timeout=150)
    seen = stages()
    assert all(a != b for a, b in zip(seen, seen[1:], strict=False))
    assert set(seen) <= {"advertise_keys", "share_keys", "share_check", "masked_input", "unmasking", "aggregating"}
    wait_for(d, lambda: any(r.get_attribute("data-round") for r in rows()), "a round in the table", timeout=150)
    before = {r.get_attribute("data-round") for r in rows()}
    wait_for(d, lambda: {r.get_attribute("data-round") for r in rows()} - before, "the rounds table to grow",
             timeout=150)

    d.find_element(By.ID, "topk-user").send_keys("user-1")
    d.find_element(By.ID, "topk-form").submit()
    items = lambda: d.find_elements(By.CSS_SELECTOR, "#topk-results tbody tr")  # noqa: E731
    wait_for(d, lambda: len(items()) == 10, "the top-k items", timeout=60)
    assert [row.text.split()[0] for row in items()] == [str(i) for i in range(1, 11)]
    meta = d.find_element(By.ID, "topk-meta")
    assert "computed on device" in meta.text and "seen items left out" in meta.text
    # ranks, item ids and titles only: no device score reaches the page (D84)
    assert [h.text for h in d.find_elements(By.CSS_SELECTOR, "#topk-results thead th")] == ["rank", "item", "title"]
    assert all(len(row.find_elements(By.TAG_NAME, "td")) == 3 for row in items())
    # unticking "leave out seen items" cannot override the device's policy, and the page says so
    d.find_element(By.ID, "topk-exclude").click()
    d.find_element(By.ID, "topk-form").submit()
    wait_for(d, lambda: "by the device's policy" in d.find_element(By.ID, "topk-meta").text,
             "the device's policy noted", timeout=60)
    assert len(items()) == 10
    shot = os.environ.get("FEDMASK_DASHBOARD_SCREENSHOT")  # this toy federation (README: make screenshot)
    if shot:
        wait_for(d, lambda: len(rows()) >= 8, "eight rounds for the picture", timeout=150)
        d.save_screenshot(shot)

    for p in (*fed.clients, fed.coordinator):
        assert p.stop() == 0
    assert fed.admin.stop() in (0, -15)  # uvicorn re-raises the SIGTERM it shut down on
