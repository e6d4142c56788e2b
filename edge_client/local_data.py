"""Local data: each hosted device's part of the dataset, and the stacked
splits a batch of devices trains on.

On the first start each hosted device's part of the dataset is cut out (the
same seeded `leave_one_out` and `random_explicit_split` the simulation uses,
so numbers are comparable) and persisted in its state dir; later starts read
it from there, and refuse a state dir made for another dataset or layout
(`DatasetError`). Each device keeps both forms (implicit and explicit); the
round's model decides which one trains. `LocalData.splits(numbers)` stacks
the devices' parts into one mini split per form whose row b is device
numbers[b] (the on-disk counterpart of the engine's `take_rows`).

Pure numpy; no torch here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_client.devices import Device
from models.data.entry import load_interactions as _load
from models.data.splits import leave_one_out, random_explicit_split
from models.data.types import ExplicitSplit, ImplicitSplit
from models.registry import ConfigError

_DATA_VERSION = 1


class DatasetError(ValueError):
    """Unknown or unreadable dataset (user-facing message)."""


def load_interactions(dataset: str, data_dir: str | None, seed: int):
    """The dataset as `models.data.types.Interactions` (same loader as `fedmask simulate`)."""
    try:
        return _load(dataset, data_dir, seed)
    except ConfigError as e:
        raise DatasetError(f"unknown or missing dataset {dataset!r}: {e}") from None
    except (ValueError, OSError) as e:
        raise DatasetError(f"cannot load dataset {dataset!r}: {e}") from None


@dataclass
class LocalSplits:
    """The stacked local data of some devices, as mini splits whose row b is device b."""

    implicit: Any  # ImplicitSplit with n_users = B
    explicit: Any  # ExplicitSplit with n_users = B
    users: np.ndarray  # dense user ids (B,)


def _device_arrays(imp, exp, user: int) -> dict[str, np.ndarray]:
    """Device `user`'s rows of the two full-dataset splits."""
    a, b = imp.train_indptr[user], imp.train_indptr[user + 1]
    e_tr = exp.train_user == user
    e_va = exp.val_user == user
    e_te = exp.test_user == user
    return {
        "imp_train": imp.train_items[a:b].astype(np.int64),
        "imp_heldout": np.array([imp.val_item[user], imp.test_item[user], imp.placebo_item[user]], dtype=np.int64),
        "imp_val_neg": imp.val_negatives[user].astype(np.int64),
        "imp_test_neg": imp.test_negatives[user].astype(np.int64),
        "exp_train_items": exp.train_item[e_tr].astype(np.int64),
        "exp_train_ratings": exp.train_rating[e_tr].astype(np.float32),
        "exp_val_items": exp.val_item[e_va].astype(np.int64),
        "exp_val_ratings": exp.val_rating[e_va].astype(np.float32),
        "exp_test_items": exp.test_item[e_te].astype(np.int64),
        "exp_test_ratings": exp.test_rating[e_te].astype(np.float32),
    }


def _stack_splits(parts: Sequence[Mapping[str, np.ndarray]], n_items: int, rating_range, item_features) -> tuple:
    B = len(parts)
    lens = np.array([len(p["imp_train"]) for p in parts], dtype=np.int64)
    indptr = np.zeros(B + 1, dtype=np.int64)
    np.cumsum(lens, out=indptr[1:])
    held = np.stack([p["imp_heldout"] for p in parts]) if B else np.zeros((0, 3), np.int64)
    imp = ImplicitSplit(
        n_users=B,
        n_items=n_items,
        train_indptr=indptr,
        train_items=np.concatenate([p["imp_train"] for p in parts]) if B else np.zeros(0, np.int64),
        val_item=held[:, 0].copy(),
        test_item=held[:, 1].copy(),
        val_negatives=np.stack([p["imp_val_neg"] for p in parts]) if B else np.zeros((0, 99), np.int64),
        test_negatives=np.stack([p["imp_test_neg"] for p in parts]) if B else np.zeros((0, 99), np.int64),
        placebo_item=held[:, 2].copy(),
        seed=0,
        item_features=item_features,
    )

    def cat(key: str, dtype) -> np.ndarray:
        return np.concatenate([p[key] for p in parts]).astype(dtype) if B else np.zeros(0, dtype)

    def rows(key: str) -> np.ndarray:
        return np.concatenate([np.full(len(p[key]), b, dtype=np.int64) for b, p in enumerate(parts)]) if B else np.zeros(0, np.int64)

    exp = ExplicitSplit(
        n_users=B,
        n_items=n_items,
        train_user=rows("exp_train_items"),
        train_item=cat("exp_train_items", np.int64),
        train_rating=cat("exp_train_ratings", np.float32),
        val_user=rows("exp_val_items"),
        val_item=cat("exp_val_items", np.int64),
        val_rating=cat("exp_val_ratings", np.float32),
        test_user=rows("exp_test_items"),
        test_item=cat("exp_test_items", np.int64),
        test_rating=cat("exp_test_ratings", np.float32),
        seed=0,
        item_features=item_features,
        rating_range=tuple(rating_range),
    )
    return imp, exp


class LocalData:
    """The local data of the hosted devices of one process (keyed by user number)."""

    def __init__(self, interactions: Any, devices: Sequence[Device], *, split_seed: int = 0) -> None:
        self.x = interactions
        self.n_users, self.n_items = int(interactions.n_users), int(interactions.n_items)
        self.devices = {d.number: d for d in devices}
        self.split_seed = split_seed
        self._local: dict[int, dict[str, np.ndarray]] = {}
        self._seen: dict[int, np.ndarray] = {}

    def prepare(self) -> int:
        """Load every hosted device's local split, creating and persisting the
        missing ones; returns how many were created."""
        missing = []
        for number, d in self.devices.items():
            got = d.store.load_data()
            if got is None:
                missing.append(number)
                continue
            arrays, meta = got
            if meta.get("version") != _DATA_VERSION or meta.get("n_items") != self.n_items or meta.get("user") != d.user:
                raise DatasetError(
                    f"state of {d.local_id} was made for another dataset or layout "
                    f"(n_items {meta.get('n_items')}, user {meta.get('user')}); use another --state-dir"
                )
            self._local[number] = arrays
        if missing:
            imp = leave_one_out(self.x, self.split_seed)
            exp = random_explicit_split(self.x, self.split_seed)
            for number in missing:
                d = self.devices[number]
                arrays = _device_arrays(imp, exp, d.user)
                d.store.save_data(
                    arrays,
                    {
                        "version": _DATA_VERSION,
                        "dataset": self.x.name,
                        "n_items": self.n_items,
                        "user": d.user,
                        "split_seed": self.split_seed,
                        "rating_range": list(exp.rating_range),
                    },
                )
                self._local[number] = arrays
        for number, arrays in self._local.items():
            self._seen[number] = np.unique(
                np.concatenate([arrays["imp_train"], arrays["imp_heldout"][:2][arrays["imp_heldout"][:2] >= 0],
                                arrays["exp_train_items"], arrays["exp_val_items"], arrays["exp_test_items"]])
            )
        return len(missing)

    def rating_range(self) -> tuple[float, float]:
        r = self.x.rating
        return (float(r.min()), float(r.max())) if len(r) else (1.0, 5.0)

    def splits(self, numbers: Sequence[int]) -> LocalSplits:
        """The stacked local data of `numbers` (row b = device numbers[b])."""
        parts = [self._local[n] for n in numbers]
        imp, exp = _stack_splits(parts, self.n_items, self.rating_range(), self.x.item_features)
        return LocalSplits(imp, exp, np.array([self.devices[n].user for n in numbers], dtype=np.int64))

    def seen(self, number: int) -> np.ndarray | None:
        """Every item device `number` has rated or interacted with (its train,
        validation and test items), or None before `prepare`."""
        return self._seen.get(number)
