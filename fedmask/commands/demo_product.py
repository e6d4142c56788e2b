"""What `fedmask demo` shows of the product besides the rounds: the admin
service it starts (dashboard, REST API, a token for the curl lines), the
popularity baseline on the hosted users, and one user's top-k computed on
their device next to what they rated highly.

The demo process holds the dataset (it chose which users the devices host),
so it can compute the baseline and list a user's own ratings; the
recommendations come from the device through the admin service, like any
application's.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import numpy as np

from fedmask.bench.processes import LOOPBACK, Child, ProcessGroup, wait_until

TOP_K = 10


@dataclass(frozen=True)
class AdminService:
    """The demo's `fedmask admin` process and its operator token."""

    child: Child
    base: str
    token: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def curl_top_k(self, user: str) -> str:
        """A curl command line (one line) asking for `user`'s top-k."""
        return (f"curl -s -H 'Authorization: Bearer {self.token}' "
                f"'{self.base}/v1/users/{user}/recommendations?k={TOP_K}'")

    def curl_resume(self) -> str:
        """A curl command line (one line) resuming the paused federation's rounds."""
        return f"curl -X POST -H 'Authorization: Bearer {self.token}' {self.base}/v1/federation/resume"

    def get(self, path: str, **params: Any) -> Any:
        import httpx

        r = httpx.get(self.base + path, params=params, headers=self.headers, timeout=30)
        r.raise_for_status()
        return r.json()

    def post(self, path: str) -> Any:
        import httpx

        r = httpx.post(self.base + path, json={"reason": "fedmask demo: the demo's rounds are done"},
                       headers=self.headers, timeout=30)
        r.raise_for_status()
        return r.json()


def start_admin(group: ProcessGroup, *, db: Path, coordinator_admin: str, coordinator_token: str,
                port: int, watch: list[Child], max_top_k: int) -> AdminService:
    """Start `fedmask admin` over the coordinator's store and admin listener,
    with one operator token generated here and top-k answers of up to
    `max_top_k` items, and wait until it is ready."""
    import httpx

    from admin.auth import token_hash

    token = secrets.token_urlsafe(24)
    entry = [{"name": "demo", "role": "operator", "sha256": token_hash(token)}]
    child = group.start("admin", ["admin", "--listen", f"{LOOPBACK}:{port}", "--database-url", f"sqlite:///{db}",
                                  "--coordinator", coordinator_admin, "--log-level", "WARNING"],
                        env={"FEDMASK_ADMIN_COORDINATOR__TOKEN": coordinator_token,
                             "FEDMASK_ADMIN_TOKENS": json.dumps(entry), "FEDMASK_ADMIN_MAX_TOP_K": str(max_top_k)})
    base = f"http://{LOOPBACK}:{port}"

    def ready() -> bool:
        try:
            return httpx.get(base + "/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(ready, 90, what="the admin service", watch=[child, *watch], step=0.3)
    return AdminService(child, base, token)


def validation_top(ranked: Sequence[int], trained: Iterable[int], k: int = TOP_K) -> list[int]:
    """The first `k` of a device's full ranking `ranked` (item indices, best
    first) that the user did not train on: the evaluation protocol's full
    ranking for the validation item (training items left out; the held-out
    validation and test items stay candidates, models/evaluation.py)."""
    left_out = set(int(i) for i in trained)
    return [int(i) for i in ranked if int(i) not in left_out][:k]


class RestGetter(Protocol):
    """What `device_top_k_val_hr` needs of the admin service: GET with query parameters."""

    def get(self, path: str, **params: Any) -> Any: ...


def sampled_hit(ranked: Sequence[int], target: int, negatives: Iterable[int], k: int = TOP_K) -> bool:
    """Whether `target` is among the first `k` of {target} + `negatives` in
    the device's full ranking `ranked` (the protocol's sampled HR@10: the
    held-out item against its 99 leak-free negatives)."""
    candidates = {int(target), *(int(i) for i in negatives)}
    in_order = [int(i) for i in ranked if int(i) in candidates]
    return int(target) in in_order[:k]


def device_top_k_val_hr(admin: RestGetter, x: Any, seed: int, users: np.ndarray, *, limit: int = 50
                        ) -> tuple[float, float, np.ndarray]:
    """Validation HR@10 of the devices' own rankings (computed on each
    device from its private state and the global model, fetched over the
    admin REST API like any top-k), over the first `limit` of `users` (dense
    indices) that hold a validation item: (full-ranking HR@10, sampled
    HR@10, the users asked).

    A device's "seen items" are its whole history, validation and test items
    included, so an answer that leaves them out can never hold the validation
    item. The demo's devices therefore let a caller ask for seen items
    (`fedmask client --recommend-seen-items`); each ranks the whole catalogue,
    and here the training items are left out (`validation_top`, the full
    ranking) or the validation item is ranked against its 99 negatives
    (`sampled_hit`). Under DP the rounds carry no metric totals (D36), so
    this is how the demo shows the model's quality."""
    from models.data.splits import leave_one_out

    split = leave_one_out(x, seed)
    full = sampled = 0
    asked: list[int] = []
    for u in users:
        if len(asked) >= limit:
            break
        target = int(split.val_item[u])
        if target < 0:
            continue
        trained = split.train_items[split.train_indptr[u]:split.train_indptr[u + 1]]
        answer = admin.get(f"/v1/users/user-{u + 1}/recommendations", k=int(split.n_items), exclude_seen="false")
        if answer.get("seen_excluded"):
            raise RuntimeError(f"user-{u + 1}'s device left its seen items out: it cannot be evaluated")
        ranked = [int(item["item_index"]) for item in answer["items"]]
        full += target in validation_top(ranked, trained)
        sampled += sampled_hit(ranked, target, split.val_negatives[u])
        asked.append(int(u))
    n = max(len(asked), 1)
    return full / n, sampled / n, np.array(asked, dtype=np.int64)


def popularity_val_hr(x: Any, seed: int, users: np.ndarray, *, full: bool = False) -> float:
    """Validation HR@10 (99 sampled negatives, the devices' own protocol; or
    with `full`, against every item the user has not trained on) of ranking
    by training popularity among `users` (dense indices), on the split the
    devices use (leave-one-out by time, seed `seed`)."""
    from models.data.splits import leave_one_out
    from models.evaluation import evaluate_implicit, finalize
    from models.reference import score_fn

    split = leave_one_out(x, seed)
    mine = np.concatenate([split.train_items[split.train_indptr[u]:split.train_indptr[u + 1]] for u in users])
    counts = np.bincount(mine, minlength=split.n_items).astype(np.float32)
    table = np.broadcast_to(counts, (split.n_users, split.n_items))
    sums = evaluate_implicit(score_fn(table), split, "val", users=users, full=full, placebo=False)
    return float(finalize(sums)["full_hr@10" if full else "hr@10"])


def rated_highly(x: Any, user: int, n: int = TOP_K) -> list[tuple[str, float]]:
    """(title, rating) of user `user`'s (dense index) best-rated items, best
    and then newest first."""
    rows = np.flatnonzero(x.user == user)
    order = sorted(rows, key=lambda i: (-float(x.rating[i]), -int(x.timestamp[i])))[:n]
    titles = x.item_titles
    return [(str(titles[x.item[i]]) if titles is not None else str(x.raw_item_ids[x.item[i]]), float(x.rating[i]))
            for i in order]


def top_k_table(answer: dict[str, Any], liked: list[tuple[str, float]], user: str) -> Any:
    from rich import box
    from rich.table import Table

    t = Table(title=f"{user}: top-{TOP_K} computed on the device (model v{answer['model_version']}, "
                    f"{answer['latency_ms']:.0f} ms on the device's link) next to what {user} rated highly",
              box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("rank", justify="right")
    t.add_column("recommended (unseen items)")  # ranked; devices send no scores (D84)
    t.add_column(f"{user} rated")
    t.add_column("stars", justify="right")
    items = answer["items"]
    for i in range(max(len(items), len(liked))):
        rec = items[i] if i < len(items) else None
        mine = liked[i] if i < len(liked) else None
        t.add_row(str(i + 1) if rec else "", (rec["title"] or rec["item_id"]) if rec else "",
                  mine[0] if mine else "", f"{mine[1]:.0f}" if mine else "")
    return t


__all__ = ["AdminService", "TOP_K", "device_top_k_val_hr", "popularity_val_hr", "rated_highly", "start_admin", "top_k_table"]
