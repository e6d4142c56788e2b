"""The dashboard shows what devices and datasets supply as text, never as
markup: a browser test in the system Chromium over a real federation.

What reaches the page from outside the operator's hands:
- item ids and titles, from the dataset file a device loads (here a
  GroupLens "latest" folder whose every title, and one item id, is a
  script injection);
- user handles, the enrolment local ids a client chooses (here an edge
  client whose devices enrol as injections: the real `fedmask client`,
  with a `sitecustomize` that renames its devices, because a hostile client
  can send any local id and the coordinator stores it as given).

`fedmask coordinator` (FedRAP on that dataset), that client and `fedmask
admin` run as processes. The page is signed in as an operator and asks each
hostile handle for its top-k through the form; it renders the handle in
the answer line and the ids and titles in the table. Every payload would
set `window.__pwned` (or document.title) if it ran. Asserted: it stays
unset, no markup element appears inside the rendered answer, no Content
Security Policy violation is reported (one would mean the page parsed a
payload as markup and only the CSP stopped it), and each string is shown
literally. A last check proves the detector: the same title put into the
page as HTML is reported at once.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from admin_federation import API, COORDINATOR_TOKEN, auth
from chromium_driver import chromium, wait_for
from integration_harness import LOOPBACK, Processes, client_args, coordinator_args, free_port, wait_serving, wait_until

from admin.auth import token_hash

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

# Handles carry no "/" (a local id is also a folder name on the client's disk).
HANDLES = [
    "<img src=x onerror=window.__pwned='handle-img'>",
    "\"><svg onload=window.__pwned='handle-svg'>",
    "javascript:window.__pwned='handle-js'",
    "{{constructor.constructor('window.__pwned=`handle-template`')()}}",
]
TITLES = [
    "<script>window.__pwned='title-script'</script>",
    "<img src=x onerror=\"window.__pwned='title-img'\">",
    "\"><svg/onload=window.__pwned='title-svg'>",
    "</td></tr></tbody></table><img src=x onerror=document.title='pwned'>",
    "javascript:window.__pwned='title-js'",
    "<a href=\"javascript:window.__pwned='title-href'\">click</a>",
]
HOSTILE_ITEM_ID = "<img src=x onerror=window.__pwned='item-id'>"
N_USERS, N_ITEMS, PER_USER = 6, 24, 12

# Renames the client's devices (user N enrols as HANDLES[N - 1]) and lets its
# state folder hold such names: a hostile client, otherwise the real one.
_SITECUSTOMIZE = """
import json, os, re
import edge_client.devices, edge_client.state
_handles = json.loads(os.environ["FEDMASK_TEST_HOSTILE_HANDLES"])
edge_client.devices.local_id_of = lambda n: _handles[n - 1]
edge_client.state._LOCAL_ID = re.compile(r"^(?!\\.\\.?$)[^/\\x00]{1,128}$")
"""

_WATCH = """
window.__pwned = undefined;
window.__violations = [];
document.addEventListener("securitypolicyviolation",
  (e) => window.__violations.push(e.violatedDirective + ": " + (e.sample || e.blockedURI)));
"""


def _items() -> list[str]:
    ids = [f"m{i}" for i in range(N_ITEMS)]
    ids[3] = HOSTILE_ITEM_ID
    return ids


def _title(i: int) -> str:
    return f"{TITLES[i % len(TITLES)]} #{i}"


def _write_dataset(folder: Path) -> Path:
    """A GroupLens "latest" folder: ratings.csv and movies.csv with hostile titles and one hostile id."""
    folder.mkdir()
    ids = _items()
    with open(folder / "ratings.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["userId", "movieId", "rating", "timestamp"])
        for u in range(1, N_USERS + 1):
            for j in range(PER_USER):
                w.writerow([u, ids[(u * 5 + j * 2 + j // 6) % N_ITEMS], 4.0, 1000 + u * 100 + j])
    with open(folder / "movies.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["movieId", "title", "genres"])
        for i, item in enumerate(ids):
            w.writerow([item, _title(i), "Drama"])
    return folder


def _start(procs: Processes, tmp_path: Path) -> str:
    """Coordinator, the hostile-handle client (users 1-4) and the admin service; the admin base URL."""
    data = _write_dataset(tmp_path / "hostile-movies")
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    db = f"sqlite:///{tmp_path / 'coordinator.db'}"
    port, admin_port, http_port = free_port(), free_port(), free_port()
    coord = procs.start("coordinator", coordinator_args(
        port, db, model="fedrap", model_params={"n_users": N_USERS, "n_items": N_ITEMS, "k": 4, "local_epochs": 1},
        cohort_size=4, cohort_minimum=4, over_selection=0.0, allow_consecutive=True, seed=1,
        round_pause=1, selection_deadline=30, training_deadline=30, advertise_keys_deadline=10,
        share_keys_deadline=10, masked_input_deadline=10, unmasking_deadline=10,
        secagg_graph="full", secagg_threshold="majority", dp_mode="none",
        admin_listen=f"{LOOPBACK}:{admin_port}",
    ), env={"FEDMASK_ADMIN__TOKEN": COORDINATOR_TOKEN})
    wait_serving(port, coord)
    path = os.pathsep.join([str(hooks), *filter(None, [os.environ.get("PYTHONPATH")])])
    client = procs.start("hostile-client", client_args(port, "1-4", tmp_path / "client", dataset=str(data),
                                                       seed=3, threads=1),
                         env={"PYTHONPATH": path, "FEDMASK_TEST_HOSTILE_HANDLES": json.dumps(HANDLES)})
    tokens = [{"name": f"{role}-1", "role": role, "sha256": token_hash(t)} for role, t in API.items()]
    admin = procs.start("admin", ["admin", "--listen", f"{LOOPBACK}:{http_port}", "--database-url", db,
                                  "--coordinator", f"{LOOPBACK}:{admin_port}", "--log-level", "WARNING"],
                        env={"FEDMASK_ADMIN_COORDINATOR__TOKEN": COORDINATOR_TOKEN,
                             "FEDMASK_ADMIN_TOKENS": json.dumps(tokens)})
    base = f"http://{LOOPBACK}:{http_port}"

    def served() -> bool:  # the first round trained: every hostile device answers a top-k
        try:
            return all(httpx.get(f"{base}/v1/users/{quote(h, safe='')}/recommendations", headers=auth("recommender"),
                                 timeout=5).status_code == 200 for h in HANDLES)
        except httpx.HTTPError:
            return False

    wait_until(served, 120, what="every hostile device serving its top-k", watch=[coord, client, admin], step=0.5)
    return base


def test_hostile_handles_titles_and_item_ids_render_as_text(procs: Processes, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    base = _start(procs, tmp_path)
    titles = {item: _title(i) for i, item in enumerate(_items())}
    with chromium() as d:
        d.get(base + "/")
        page_title = d.title
        d.execute_script(_WATCH)
        d.find_element(By.ID, "token-input").send_keys(API["operator"])
        d.find_element(By.ID, "token-form").submit()
        k_field = d.find_element(By.ID, "topk-k")
        k_field.clear()
        k_field.send_keys(str(N_ITEMS))  # every item the user has not seen
        rows = lambda: d.find_elements(By.CSS_SELECTOR, "#topk-results tbody tr")  # noqa: E731
        shown_ids: set[str] = set()
        for handle in HANDLES:
            field = d.find_element(By.ID, "topk-user")
            field.clear()
            field.send_keys(handle)
            d.find_element(By.ID, "topk-form").submit()
            answered = f"(user {handle})"
            wait_for(d, lambda: answered in d.find_element(By.ID, "topk-meta").text,  # noqa: B023
                     f"the top-k of {handle!r}", timeout=30)
            wait_for(d, lambda: len(rows()) > 0, "the top-k rows", timeout=10)
            for row in rows():
                rank, item, title = (td.text for td in row.find_elements(By.TAG_NAME, "td"))
                assert title == titles[item], (item, title)  # the title, literally
                shown_ids.add(item)
            # nothing the device or the dataset sent became an element
            planted = d.execute_script(
                "return document.querySelectorAll('#topk-results tbody *:not(tr):not(td), #topk-meta *').length")
            assert planted == 0
        assert HOSTILE_ITEM_ID in shown_ids and len(shown_ids) >= len(TITLES)
        d.execute_script("return new Promise((r) => setTimeout(r, 500))")  # let any handler fire
        assert d.execute_script("return window.__pwned") is None
        assert d.title == page_title
        assert d.execute_script("return window.__violations") == []

        # The detector works: the same strings put into the page as HTML are caught.
        d.execute_script("const div = document.createElement('div'); div.innerHTML = arguments[0];"
                         "document.body.appendChild(div);", TITLES[1] + HANDLES[0])
        wait_for(d, lambda: d.execute_script("return window.__violations.length") > 0,
                 "the CSP to report the injected handler", timeout=10)
        assert d.execute_script("return window.__pwned") is None  # and the CSP is the second line
