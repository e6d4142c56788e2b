"""The demo's closing validation figure under DP (`device_top_k_val_hr`):
a device's "seen items" are its whole history, the held-out validation
item included, so the figure must come from the device's full ranking with
only the training items left out (`validation_top`), never from an answer
with the seen items left out (which can never hold the validation item)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fedmask.commands.demo_product import device_top_k_val_hr, sampled_hit, validation_top
from models.data.splits import leave_one_out
from models.data.synthetic import synthetic


def test_validation_top_leaves_out_training_items_only() -> None:
    assert validation_top([5, 1, 9, 2, 7], trained=[5, 2], k=2) == [1, 9]
    assert validation_top([3, 4], trained=[], k=10) == [3, 4]


def test_sampled_hit_ranks_the_target_among_its_negatives_only() -> None:
    ranked = [50, 51, 1, 2, 3, 7]  # 50, 51: not candidates (trained or unsampled)
    assert sampled_hit(ranked, target=3, negatives=[1, 2, 7], k=3)
    assert not sampled_hit(ranked, target=7, negatives=[1, 2, 3], k=3)


class FakeDevices:
    """The admin API over devices that rank the training items first, then
    the validation item (hit) or everything else (miss), as a device with
    `recommend_seen_items` answers `exclude_seen=false`."""

    def __init__(self, split: Any, hit_users: set[int], *, leave_seen_out: bool = False) -> None:
        self.split, self.hit_users, self.leave_seen_out = split, hit_users, leave_seen_out
        self.asked: list[dict[str, Any]] = []

    def get(self, path: str, **params: Any) -> Any:
        self.asked.append(params)
        u = int(path.split("user-")[1].split("/")[0]) - 1
        s = self.split
        trained = [int(i) for i in s.train_items[s.train_indptr[u]:s.train_indptr[u + 1]]]
        target = int(s.val_item[u])
        rest = [i for i in range(s.n_items) if i not in trained and i != target]
        ranking = trained + ([target] + rest if u in self.hit_users else rest + [target])
        if self.leave_seen_out:
            ranking = [i for i in ranking if i not in trained and i != target]
        return {"items": [{"item_index": i} for i in ranking[: int(params["k"])]],
                "seen_excluded": self.leave_seen_out}


def test_the_demo_scores_the_devices_full_ranking() -> None:
    x = synthetic(n_users=12, n_items=200, seed=3)
    split = leave_one_out(x, 0)
    users = np.flatnonzero(split.val_item >= 0)[:8]
    hits = {int(u) for u in users[:3]}
    admin = FakeDevices(split, hits)
    hr, hr_sampled, asked = device_top_k_val_hr(admin, x, 0, users)
    assert list(asked) == [int(u) for u in users]
    assert hr == pytest.approx(3 / 8)
    assert hr_sampled == pytest.approx(3 / 8)  # these fakes rank a miss below every negative
    assert all(p["exclude_seen"] == "false" for p in admin.asked)
    with pytest.raises(RuntimeError, match="left its seen items out"):
        device_top_k_val_hr(FakeDevices(split, hits, leave_seen_out=True), x, 0, users)
