"""Keyed (counter-based) randomness: the hash, the distributions, and the
property the models rely on: a device's draws do not depend on its batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.base import LocalRound
from models.data.sampling import cohort_data
from models.data.splits import leave_one_out
from models.data.synthetic import synthetic
from models.registry import build_model
from models.keyed_random import KeyedStream, Purpose, check_seed, mix32, mix32_int, user_normal


def test_mix32_is_lowbias32_known_answers() -> None:
    # lowbias32 computed by the C reference (uint32 arithmetic)
    x = torch.tensor([0, 1, 2, 0xFFFFFFFF, 123456789, 1 << 31, (1 << 31) - 1])
    want = [0, 1753845952, 3507691905, 1734902346, 2834422664, 3427483940, 2368339896]
    assert mix32(x).tolist() == want
    assert [mix32_int(int(v)) for v in x] == want


def test_mix32_tensor_equals_python_on_random_words() -> None:
    x = torch.from_numpy(np.random.default_rng(0).integers(0, 1 << 32, 10_000, dtype=np.int64))
    got = mix32(x)
    assert got.min() >= 0 and got.max() < (1 << 32)
    assert got.tolist() == [mix32_int(int(v)) for v in x]


def test_streams_are_named_by_all_their_words() -> None:
    a = KeyedStream.of(0, Purpose.NEGATIVES, 3, 1)
    assert a == KeyedStream.of(0, Purpose.NEGATIVES, 3, 1)
    others = [
        KeyedStream.of(1, Purpose.NEGATIVES, 3, 1),
        KeyedStream.of(0, Purpose.SHUFFLE, 3, 1),
        KeyedStream.of(0, Purpose.NEGATIVES, 4, 1),
        KeyedStream.of(0, Purpose.NEGATIVES, 3, 2),
        KeyedStream.of(1 << 32, Purpose.NEGATIVES, 3, 1),  # the high word of a 64-bit seed counts
        KeyedStream.of(-1, Purpose.NEGATIVES, 3, 1),
    ]
    assert len({o.key for o in others} | {a.key}) == len(others) + 1


def test_distributions() -> None:
    st = KeyedStream.of(4, Purpose.INIT, 9)
    users = torch.arange(200)[:, None]
    idx = torch.arange(500)[None, :]
    u = st.uniform(users, idx)
    assert u.dtype == torch.float64 and 0 < float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.005 and abs(float(u.var()) - 1 / 12) < 0.002
    k = st.integers(7, users, idx)
    counts = torch.bincount(k.reshape(-1), minlength=7).double()
    expected = k.numel() / 7
    assert float(((counts - expected) ** 2 / expected).sum()) < 30  # 6 dof
    z = st.normal(users, idx)
    assert abs(float(z.mean())) < 0.01 and abs(float(z.std()) - 1) < 0.01
    # no correlation between neighbouring users or indices
    assert abs(float(torch.corrcoef(torch.stack([z[:-1].reshape(-1), z[1:].reshape(-1)]))[0, 1])) < 0.01
    assert abs(float(torch.corrcoef(torch.stack([z[:, :-1].reshape(-1), z[:, 1:].reshape(-1)]))[0, 1])) < 0.01
    with pytest.raises(ValueError):
        st.integers(0, users, idx)


def test_seed_must_be_an_int() -> None:
    assert check_seed(3) == 3
    with pytest.raises(TypeError):
        check_seed(torch.Generator())
    with pytest.raises(TypeError):
        check_seed(True)


def test_user_normal_is_per_user() -> None:
    a = user_normal(5, 1, torch.tensor([3, 8, 1]), (4, 6), 0.1)
    b = user_normal(5, 1, torch.tensor([1, 3]), (4, 6), 0.1)
    assert a.shape == (3, 4, 6) and a.dtype == torch.float32
    assert torch.equal(a[0], b[1]) and torch.equal(a[2], b[0])
    assert not torch.equal(a[0], user_normal(5, 2, torch.tensor([3]), (4, 6), 0.1)[0])  # another tag
    assert torch.equal(user_normal(5, 1, torch.tensor([3]), (4, 6), 0.0), torch.zeros(1, 4, 6))


@pytest.mark.parametrize(
    ("name", "explicit", "params"),
    [
        ("fedrap", False, {"k": 8, "local_epochs": 3, "init_std_d": 0.05}),
        ("pfedrec", False, {"k": 8, "batch_size": 16}),
        ("fedmf", False, {"k": 8}),
        ("fedmf", True, {"k": 8, "user_solver": "gd", "local_epochs": 2}),
        ("fedmmf", True, {"k": 8, "mask_steps": 20}),
    ],
)
def test_every_model_trains_a_device_the_same_in_any_batch(name: str, explicit: bool, params: dict) -> None:
    """init_private and local_update of a device are the same alone, in a batch
    of 5 and in a batch of 30 in another order (up to float reduction order)."""
    from models.data.splits import random_explicit_split

    x = synthetic(60, 150, seed=3)
    split = random_explicit_split(x, 0) if explicit else leave_one_out(x, 0)
    model = build_model(name, explicit=explicit, n_users=x.n_users, n_items=x.n_items,
                        item_features=x.item_features, overrides=params)  # fmt: skip
    g0 = model.init_global(torch.Generator().manual_seed(0))
    thirty = np.random.default_rng(1).permutation(x.n_users)[:30]
    five = thirty[[3, 11, 0, 29, 7]]

    def run(users: np.ndarray) -> tuple[dict, torch.Tensor, dict]:
        data = cohort_data(split, users)
        priv = model.init_private(data, g0, 17)
        new_priv, upd = model.local_update(LocalRound(g0, priv, data, 2, 17))
        return priv, upd, new_priv

    p30, u30, n30 = run(thirty)
    p5, u5, n5 = run(five)
    for j, u in enumerate(five):
        p1, u1, n1 = run(np.array([u]))
        i = int(np.flatnonzero(thirty == u)[0])
        for key in p1:
            assert torch.equal(p1[key][0], p5[key][j]) or torch.allclose(p1[key][0], p5[key][j], atol=1e-6)
            assert torch.allclose(p1[key][0], p30[key][i], atol=1e-6)
        torch.testing.assert_close(u1[0], u5[j], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(u1[0], u30[i], atol=1e-5, rtol=1e-5)
        for key in n1:
            torch.testing.assert_close(n1[key][0], n30[key][i], atol=1e-5, rtol=1e-5)
    # and the seed matters
    data = cohort_data(split, five)
    _, other = model.local_update(LocalRound(g0, model.init_private(data, g0, 18), data, 2, 18))
    assert not torch.allclose(other, u5, atol=1e-4)
