"""Scoring from the item tables' rows at the scored items only
(`FederatedRecommender.gathered_tables`, `PrivateTables.take_items`, used
by the simulator's evaluation): the same scores bit for bit as `score` on
whole rows, for FedRAP's variants, from tables in RAM and on disk. Oracle:
`score` itself on `take`'s whole rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from models.fedrap import FedRAP
from models.registry import build_model
from models.sim.private_tables import PrivateTables


def _fedrap(params: dict, n_users: int, m: int, gen: torch.Generator) -> tuple[FedRAP, dict, dict]:
    """A FedRAP variant with a random global state and random private rows (D where it has one)."""
    model = build_model("fedrap", explicit=False, n_users=n_users, n_items=m, overrides=params)
    assert isinstance(model, FedRAP)
    k = model.k
    global_ = {name: v + torch.randn(v.shape, generator=gen) for name, v in model.init_global(gen).items()}
    state = {"u": torch.randn(n_users, k, generator=gen), "b": torch.randn(n_users, generator=gen)}
    if model.gathered_tables():
        state["D"] = torch.randn(n_users, m, k, generator=gen)
    return model, global_, state


@pytest.mark.parametrize("params", [{}, {"variant": "c_only"}, {"variant": "d_only"}, {"item_bias": True}])
@pytest.mark.parametrize("disk", [False, True])
def test_scores_from_gathered_rows_equal_scores_from_whole_rows(params: dict, disk: bool, tmp_path: Path) -> None:
    n_users, m = 12, 40
    gen = torch.Generator().manual_seed(0)
    model, global_, state = _fedrap(params, n_users, m, gen)
    if disk:
        tables = PrivateTables.on_disk({name: v[:1] for name, v in state.items()}, n_users, tmp_path)
        tables.put(None, state)
    else:
        tables = PrivateTables.in_memory(state, n_users)
    rows = torch.tensor([3, 0, 7, 11])
    items = torch.randint(0, m, (4, 9), generator=gen)
    want = model.score(global_, tables.take(rows), rows, items)
    got = model.score_gathered(global_, tables.take_items(rows, items, model.gathered_tables()), rows, items)
    assert torch.equal(got, want)
    assert model.gathered_tables() == (() if params.get("variant") == "c_only" else ("D",))


def test_a_model_without_item_tables_gathers_nothing() -> None:
    assert build_model("fedmf", explicit=False, n_users=3, n_items=5).gathered_tables() == ()  # FedRAP without D
    model = build_model("pfedrec", explicit=False, n_users=3, n_items=5)
    assert model.gathered_tables() == ()
    with pytest.raises(NotImplementedError):
        model.score_gathered({}, {}, torch.zeros(1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long))


@pytest.mark.parametrize("params", [{}, {"variant": "c_only"}, {"variant": "d_only"}, {"item_bias": True}])
def test_scores_of_every_item_at_once_equal_score_bit_for_bit(params: dict) -> None:
    """`score_all` (the full ranking's scores, D101's cheaper test) against
    `score` at items 0..m-1; the scratch buffer reused across batches of
    different sizes changes nothing, and rows taken read-only as a view
    score the same as copied rows."""
    n_users, m = 12, 40
    model, global_, state = _fedrap(params, n_users, m, torch.Generator().manual_seed(1))
    tables = PrivateTables.in_memory(state, n_users)
    scratch: dict[str, torch.Tensor] = {}
    for rows in (torch.arange(0, 5), torch.arange(5, 12), torch.arange(0, 5)):
        items = torch.arange(m).expand(len(rows), m)
        want = model.score(global_, tables.take(rows), rows, items)
        view = tables.take(rows, read_only=True)
        assert all(v.data_ptr() == state[name][int(rows[0])].data_ptr() for name, v in view.items())  # no copy
        got = model.score_all(global_, view, rows, scratch)
        assert got is not None and torch.equal(got, want)


def test_the_full_ranking_through_score_all_gives_the_same_sums() -> None:
    """evaluate_implicit with `score_all` and without: the same sums exactly;
    a model without a faster path (None) falls back to `score_fn`."""
    from models.data.synthetic import synthetic
    from models.data.entry import make_split
    from models.evaluation import evaluate_implicit

    split = make_split(synthetic(30, 50, seed=3), False, 0)
    model = build_model("fedrap", explicit=False, n_users=split.n_users, n_items=split.n_items)
    assert isinstance(model, FedRAP)
    gen = torch.Generator().manual_seed(2)
    global_ = model.init_global(gen)
    state = {"u": torch.randn(split.n_users, model.k, generator=gen), "b": torch.zeros(split.n_users),
             "D": torch.randn(split.n_users, split.n_items, model.k, generator=gen)}

    def score_fn(users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return model.score(global_, {n: v[users] for n, v in state.items()}, users, items)

    def score_all(users: torch.Tensor) -> torch.Tensor | None:
        return model.score_all(global_, {n: v[users] for n, v in state.items()}, users)

    plain = evaluate_implicit(score_fn, split, "test", batch_size=7)
    assert evaluate_implicit(score_fn, split, "test", batch_size=7, score_all=score_all) == plain
    assert evaluate_implicit(score_fn, split, "test", batch_size=7, score_all=lambda u: None) == plain
