"""A real federation with the admin service on top, for the tests of
`fedmask admin` as a process: a `fedmask coordinator` process with its admin
listener (token from the environment), two edge-client processes hosting
users 1-2 and 3-4 of the synthetic dataset (the second started with
--no-serve-recommendations), and `fedmask admin` over the coordinator's
SQLite store, with one API token per role."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import httpx
from integration_harness import (
    LOOPBACK,
    Processes,
    client_args,
    coordinator_args,
    free_port,
    wait_serving,
    wait_until,
)

from admin.auth import token_hash
from fedmask.bench.processes import Child

COORDINATOR_TOKEN = "admin-listener-token-for-the-admin-service-test"
API = {"operator": "operator-token-" + "o" * 32, "viewer": "viewer-token-" + "v" * 32,
       "recommender": "recommender-token-" + "r" * 32}
SEED = 3
N_ITEMS = 300


def auth(role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {API[role]}"}


@dataclass
class AdminFederation:
    db: str
    base: str
    coordinator: Child
    admin: Child
    clients: list[Child]
    state_dirs: dict[str, Path]

    @property
    def everyone(self) -> list[Child]:
        return [self.coordinator, self.admin, *self.clients]


def start(procs: Processes, tmp_path: Path) -> AdminFederation:
    """Start everything and wait until the admin service is ready."""
    db = f"sqlite:///{tmp_path / 'coordinator.db'}"
    port, admin_port, http_port = free_port(), free_port(), free_port()
    coord = procs.start("coordinator", coordinator_args(
        port, db, model="fedrap", model_params={"n_users": 200, "n_items": N_ITEMS, "k": 8, "local_epochs": 1},
        cohort_size=4, cohort_minimum=4, over_selection=0.0, allow_consecutive=True, seed=1,
        round_pause=1, selection_deadline=60, training_deadline=60, advertise_keys_deadline=10,
        share_keys_deadline=10, masked_input_deadline=10, unmasking_deadline=10,
        secagg_graph="full", secagg_threshold="majority", dp_mode="none",
        admin_listen=f"{LOOPBACK}:{admin_port}",
    ), env={"FEDMASK_ADMIN__TOKEN": COORDINATOR_TOKEN})
    wait_serving(port, coord)
    dirs = {"client-a": tmp_path / "client-a", "client-b": tmp_path / "client-b"}
    clients = [
        procs.start("client-a", client_args(port, "1-2", dirs["client-a"], dataset="synthetic", seed=SEED,
                                            threads=1)),
        procs.start("client-b", client_args(port, "3-4", dirs["client-b"], dataset="synthetic", seed=SEED,
                                            threads=1, no_serve_recommendations=True)),
    ]
    tokens = [{"name": f"{role}-1", "role": role, "sha256": token_hash(t)} for role, t in API.items()]
    admin = procs.start("admin", ["admin", "--listen", f"{LOOPBACK}:{http_port}", "--database-url", db,
                                  "--coordinator", f"{LOOPBACK}:{admin_port}", "--log-level", "WARNING"],
                        env={"FEDMASK_ADMIN_COORDINATOR__TOKEN": COORDINATOR_TOKEN,
                             "FEDMASK_ADMIN_TOKENS": json.dumps(tokens)})
    fed = AdminFederation(db, f"http://{LOOPBACK}:{http_port}", coord, admin, clients, dirs)

    def ready() -> bool:
        try:
            return httpx.get(fed.base + "/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(ready, 90, what="the admin service ready", watch=fed.everyone, step=0.2)
    return fed
