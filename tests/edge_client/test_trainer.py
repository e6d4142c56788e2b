"""The trainer adapter: the engine's batched path, private state on disk, top-k."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from edge_client.state import ClientStore
from edge_client.devices import Device, local_id_of
from edge_client.local_data import LocalData
from edge_client.queries import top_k
from edge_client.recommend_policy import RecommendationPolicy
from edge_client.task import TaskSpec
from edge_client.trainer import Trainer, TrainingError, TrainingFailure, synthetic_updates
from models.base import LocalRound
from models.data.sampling import cohort_data, explicit_train_csr
from models.data.splits import leave_one_out, random_explicit_split
from models.data.synthetic import synthetic
from models.data.types import ExplicitSplit

NUMBERS = [3, 5, 8, 13]
HYPER = {"k": 8, "local_epochs": 2}


@pytest.fixture(scope="module")
def interactions():
    return synthetic(seed=0)


@pytest.fixture
def trainer(tmp_path: Path, interactions):
    store = ClientStore(tmp_path).open()
    data = LocalData(interactions, [Device(n, store.device(local_id_of(n))) for n in range(1, 21)], split_seed=0)
    t = Trainer(data, seed=0, global_path=tmp_path / "global.fms")
    assert data.prepare() == 20
    yield t
    store.close()


def _task(trainer: Trainer, name: str, hyper: dict, *, round_number: int = 4, version: int = 1) -> tuple[TaskSpec, dict]:
    entry = trainer.model_for(name, hyper)
    g = entry.model.init_global(torch.Generator().manual_seed(11))
    spec = TaskSpec(
        model_name=name, model_version=version, round_number=round_number, round_idx=round_number - 1,
        hyperparameters=hyper, global_params={k: v.numpy() for k, v in g.items()},
        vector_length=entry.model.update_dim,
    )
    return spec, g


@pytest.mark.parametrize(("name", "hyper"), [("fedrap", HYPER), ("pfedrec", {"k": 8}), ("fedmf", {"k": 8, "explicit": True})])
def test_training_a_batch_is_exactly_the_engine_path(trainer: Trainer, interactions, name: str, hyper: dict) -> None:
    spec, global_ = _task(trainer, name, hyper)
    model = trainer.model_for(name, hyper).model
    explicit = bool(hyper.get("explicit"))
    split = random_explicit_split(interactions, 0) if explicit else leave_one_out(interactions, 0)
    users = np.array(NUMBERS) - 1
    data = cohort_data(split, users, explicit_csr=explicit_train_csr(split) if isinstance(split, ExplicitSplit) else None)
    private = model.init_private(data, global_, trainer.seed)
    want_priv, want = model.local_update(LocalRound(global_, private, data, spec.round_idx, trainer.seed))

    out = trainer.train(spec, NUMBERS)
    np.testing.assert_array_equal(out.updates, want.numpy().astype(np.float64))
    for i, n in enumerate(NUMBERS):  # the new private rows are on disk, one file per device
        loaded = trainer.devices[n].store.load_model(name)
        assert loaded is not None
        arrays, meta = loaded
        assert meta["model_version"] == 1 and meta["round_number"] == spec.round_number
        for k, v in want_priv.items():
            np.testing.assert_array_equal(arrays[k], v[i].numpy())

    # round 2 for a subset starts from the stored rows (take_rows/put_rows on disk)
    spec2 = TaskSpec(**{**spec.__dict__, "round_number": 5, "round_idx": 4})
    sub = [1, 3]  # rows of NUMBERS
    rows = torch.tensor(sub)
    priv2 = {k: v.index_select(0, rows) for k, v in want_priv.items()}
    data2 = cohort_data(split, users[sub], explicit_csr=explicit_train_csr(split) if isinstance(split, ExplicitSplit) else None)
    _, want2 = model.local_update(LocalRound(global_, priv2, data2, 4, trainer.seed))
    out2 = trainer.train(spec2, [NUMBERS[i] for i in sub])
    np.testing.assert_array_equal(out2.updates, want2.numpy().astype(np.float64))


def test_dp_clips_and_noises_every_row(trainer: Trainer) -> None:
    spec, _ = _task(trainer, "fedrap", HYPER)
    spec = TaskSpec(**{**spec.__dict__, "dp_mode": "local", "dp_clip_norm": 0.1, "dp_noise_stddev": 0.0})
    out = trainer.train(spec, NUMBERS)
    assert np.all(np.linalg.norm(out.updates, axis=1) <= 0.1 + 1e-6)
    rows = [out.device_metrics(b) for b in range(4)]
    assert all(m["devices"] == 1 and m["clipped"] == 1 and m["update_norm"] > 0.1 for m in rows)
    spec = TaskSpec(**{**spec.__dict__, "dp_noise_stddev": 0.05})
    a = trainer.train(spec, NUMBERS).updates
    b = trainer.train(spec, NUMBERS).updates
    assert np.std(a) > 0.01 and not np.allclose(a, b)  # noise from os.urandom, not --seed


def test_each_device_has_its_own_metric_values(trainer: Trainer) -> None:
    """What a device appends to its masked input: its own values only (D35)."""
    spec, _ = _task(trainer, "fedrap", HYPER)
    out = trainer.train(spec, NUMBERS)
    rows = [out.device_metrics(b) for b in range(4)]
    assert out.examples is not None and out.norms is not None
    for b, m in enumerate(rows):
        assert m["devices"] == 1 and m["val_sampled_count"] == 1 and m["examples"] == out.examples[b]
        assert m["update_norm"] == pytest.approx(out.norms[b]) and "clipped" not in m  # no DP: nothing clipped
        assert m["val_sampled_hits@10"] in (0.0, 1.0) and 0 <= m["val_sampled_ndcg@10"] <= m["val_sampled_hits@10"]
    assert len({m["examples"] for m in rows}) > 1  # per device, not a batch total


def test_model_mismatch_is_reported(trainer: Trainer) -> None:
    spec, _ = _task(trainer, "fedrap", HYPER)
    bad = TaskSpec(**{**spec.__dict__, "global_params": {"C": np.zeros((5, 8), np.float32)}})
    with pytest.raises(TrainingError, match="do not fit") as e:
        trainer.train(bad, NUMBERS)
    assert e.value.reason is TrainingFailure.MODEL_MISMATCH
    with pytest.raises(TrainingError, match="vector_length"):
        trainer.train(TaskSpec(**{**spec.__dict__, "vector_length": 7}), NUMBERS)
    with pytest.raises(TrainingError, match="cannot build"):
        trainer.model_for("fedrap", {"no_such_knob": 1})


def test_top_k_on_the_device(trainer: Trainer) -> None:
    with pytest.raises(LookupError):
        top_k(trainer, 3, 5, exclude_seen=True)
    spec, global_ = _task(trainer, "fedrap", HYPER, version=7)
    trainer.train(spec, NUMBERS)
    with pytest.raises(LookupError, match="not trained"):
        top_k(trainer, 4, 5, exclude_seen=True)  # hosted, never selected
    items, scores, version = top_k(trainer, 5, 10, exclude_seen=True)
    assert version == 7 and len(items) == 10 and scores == sorted(scores, reverse=True)
    seen_items = trainer.data.seen(5)
    assert seen_items is not None
    seen = set(seen_items.tolist())
    assert seen and not seen & set(items)
    # the same numbers as model.score over all items with the stored private state
    model = trainer.model_for("fedrap", HYPER).model
    loaded = trainer.devices[5].store.load_model("fedrap")
    assert loaded is not None
    arrays, _ = loaded
    priv = {k: torch.as_tensor(v).unsqueeze(0) for k, v in arrays.items()}
    s = model.score(global_, priv, torch.tensor([4]), torch.arange(trainer.n_items).unsqueeze(0))[0]
    s[list(seen)] = -float("inf")
    assert items == torch.topk(s, 10).indices.tolist()
    all_items, _, _ = top_k(trainer, 5, trainer.n_items, exclude_seen=False)
    assert len(all_items) == trainer.n_items


def test_top_k_of_the_synthetic_benchmark_model(trainer: Trainer) -> None:
    """A synthetic round with an item catalogue is remembered, and top-k reads
    the global mean as an n_items x (L // n_items) table times the device's
    own user vector; without a catalogue the device is not ready."""
    n, width = trainer.n_items, 3
    mean = np.random.default_rng(1).standard_normal(n * width + 2).astype(np.float32)
    spec = TaskSpec(model_name="synthetic", model_version=5, round_number=2, round_idx=0,
                    hyperparameters={"vector_length": mean.size}, global_params={"mean": mean},
                    vector_length=mean.size)
    trainer.synthetic_updates(spec, [1, 2], clip=1.0)
    with pytest.raises(LookupError):  # no catalogue: nothing remembered, no model
        top_k(trainer, 3, 5, exclude_seen=False)
    spec = TaskSpec(**{**spec.__dict__, "hyperparameters": {"vector_length": mean.size, "n_items": n}})
    trainer.synthetic_updates(spec, [1, 2], clip=1.0)
    items, scores, version = top_k(trainer, 3, 5, exclude_seen=True)
    u = np.random.default_rng([0, trainer.devices[3].user, 0x70B]).standard_normal(width).astype(np.float32)
    expected = mean[: n * width].reshape(n, width) @ u
    seen = trainer.data.seen(3)
    assert seen is not None and len(seen)
    expected[seen] = -np.inf
    assert version == 5 and items == np.argsort(-expected, kind="stable")[:5].tolist()
    np.testing.assert_allclose(scores, expected[items], rtol=1e-6)
    assert top_k(trainer, 4, 5, exclude_seen=True)[0] != items  # every device has its own user vector
    wrong = TaskSpec(**{**spec.__dict__, "hyperparameters": {"vector_length": mean.size, "n_items": n - 1}})
    trainer.synthetic_updates(wrong, [1], clip=1.0)
    with pytest.raises(LookupError, match="catalogue"):
        top_k(trainer, 3, 5, exclude_seen=True)


def test_answer_maps_items_to_the_dataset_and_may_refuse(trainer: Trainer) -> None:
    from edge_client.queries import answer
    from fedmask_proto.v1 import session_pb2 as S

    spec, _ = _task(trainer, "fedrap", HYPER, version=7)
    trainer.train(spec, NUMBERS)
    devices = {100 + n: d for n, d in trainer.devices.items()}
    req = S.DeviceRequest(correlation_id="c-1", device_id=105, top_k=S.TopKQuery(k=4, exclude_seen=True))
    resp = answer(req, devices, trainer)
    assert resp.WhichOneof("response") == "top_k", resp
    items, _, _ = top_k(trainer, 5, 4, exclude_seen=True)
    raw = trainer.x.raw_item_ids
    assert list(resp.top_k.item_ids) == items
    assert list(resp.top_k.dataset_item_ids) == [str(raw[i]) for i in items]
    titles = trainer.x.item_titles
    assert titles is not None and list(resp.top_k.titles) == [str(titles[i]) for i in items]
    refused = answer(req, devices, trainer, policy=RecommendationPolicy(serve=False))
    assert refused.WhichOneof("response") == "error"
    assert refused.error.code == S.DEVICE_ERROR_CODE_REFUSED and "--no-serve-recommendations" in refused.error.message


def test_what_leaves_the_device_is_its_policys(trainer: Trainer) -> None:
    """D84: ranked items without scores; at most the device's cap whatever k asks; the seen
    items left out unless the device's owner lets a request ask for them, and the answer says which."""
    from edge_client.queries import answer
    from fedmask_proto.v1 import session_pb2 as S

    spec, _ = _task(trainer, "fedrap", HYPER, version=7)
    trainer.train(spec, NUMBERS)
    devices = {100 + n: d for n, d in trainer.devices.items()}
    rated = trainer.data.seen(5)
    assert rated is not None and len(rated)
    seen = {int(i) for i in rated}

    def ask(k: int, exclude_seen: bool, policy: RecommendationPolicy = RecommendationPolicy()) -> S.TopKResult:
        req = S.DeviceRequest(correlation_id="c", device_id=105, top_k=S.TopKQuery(k=k, exclude_seen=exclude_seen))
        resp = answer(req, devices, trainer, policy=policy)
        assert resp.WhichOneof("response") == "top_k", resp
        assert list(resp.top_k.scores) == [] and resp.top_k.HasField("seen_excluded")
        return resp.top_k

    n = trainer.n_items
    everything = ask(n, exclude_seen=False)  # the attack: the whole catalogue, seen items asked for
    assert len(everything.item_ids) == 100 and everything.seen_excluded  # the default cap; seen items left out
    assert not seen & set(everything.item_ids)
    assert list(ask(n, exclude_seen=True).item_ids) == list(everything.item_ids)  # the difference is empty
    assert list(everything.item_ids) == top_k(trainer, 5, 100, exclude_seen=True)[0]  # in rank order
    small = ask(n, exclude_seen=False, policy=RecommendationPolicy(max_k=7))
    assert list(small.item_ids) == list(everything.item_ids)[:7]
    # an owner who lets requests ask for seen items: honoured, and said
    shared = ask(n, exclude_seen=False, policy=RecommendationPolicy(share_seen=True, max_k=n))
    assert not shared.seen_excluded and len(shared.item_ids) == n and seen <= set(shared.item_ids)
    assert ask(5, exclude_seen=True, policy=RecommendationPolicy(share_seen=True)).seen_excluded
    with pytest.raises(ValueError, match="--max-top-k"):
        RecommendationPolicy(max_k=0)


def test_item_catalogue_carries_movielens_titles() -> None:
    from edge_client.queries import item_catalogue
    from models.data.types import Interactions

    empty = np.zeros(0, np.int64)
    x = Interactions(name="ml-100k", user=empty, item=empty, rating=np.zeros(0, np.float32), timestamp=empty,
                     n_users=0, n_items=2, raw_user_ids=empty, raw_item_ids=np.array([1, 50]),
                     item_titles=np.array(["Toy Story (1995)", "Star Wars (1977)"], dtype=object))
    assert item_catalogue(x) == (["1", "50"], ["Toy Story (1995)", "Star Wars (1977)"])


def test_restart_reads_the_persisted_split_and_state(tmp_path: Path, interactions) -> None:
    with ClientStore(tmp_path) as store:
        d1 = LocalData(interactions, [Device(n, store.device(local_id_of(n))) for n in (1, 2)])
        t1 = Trainer(d1, global_path=tmp_path / "global.fms")
        assert d1.prepare() == 2
        spec, _ = _task(t1, "fedrap", HYPER, version=3)
        t1.train(spec, [1, 2])
        before = top_k(t1, 1, 5, exclude_seen=True)
    with ClientStore(tmp_path) as store:
        d2 = LocalData(interactions, [Device(n, store.device(local_id_of(n))) for n in (1, 2)])
        t2 = Trainer(d2, global_path=tmp_path / "global.fms")
        assert d2.prepare() == 0
        assert top_k(t2, 1, 5, exclude_seen=True) == before  # global params and private state from disk


def test_synthetic_updates_are_a_function_of_seed_round_and_device() -> None:
    a = synthetic_updates([4, 9], round_number=3, vector_length=6, seed=1, scale=0.5)
    assert a.shape == (2, 6) and np.abs(a).max() <= 0.5
    np.testing.assert_array_equal(a[1], np.random.default_rng([1, 3, 9]).uniform(-0.5, 0.5, 6))
    assert not np.array_equal(a, synthetic_updates([4, 9], round_number=4, vector_length=6, seed=1, scale=0.5))
