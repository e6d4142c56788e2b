"""scripts/make_synthetic_csv.py: the pinned shapes (checked on their counts, which
decide the size before any dense work), the CSV it writes, and its errors."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from models.data.synthetic_population import draw_latent

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_synthetic_csv", REPO / "scripts" / "make_synthetic_csv.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def counts_of(script: ModuleType, argv: list[str]) -> tuple[argparse.Namespace, np.ndarray]:
    a = script.parse(argv)
    shape = script.population_shape(a.users, a.items, mean_interactions=a.mean_interactions,
                                    min_interactions=a.min_interactions, max_interactions=a.max_interactions,
                                    popularity=a.popularity)  # fmt: skip
    return a, draw_latent(np.random.default_rng(a.seed), shape).counts


def test_the_sparse_preset_is_the_papers_sparse_shape(script: ModuleType) -> None:
    a, counts = counts_of(script, ["x.csv", "--preset", "sparse-8k"])
    assert (a.users, a.items) == (8072, 11830)
    assert abs(counts.sum() - 64_000) <= 0.02 * 64_000 and counts.min() >= 3
    assert f"{counts.sum():,} interactions, {counts.min()} to {counts.max()} per user" in str(script.__doc__)
    for seed in (1, 2, 3):  # not a lucky seed
        assert abs(counts_of(script, ["x.csv", "--preset", "sparse-8k", "--seed", str(seed)])[1].sum() - 64_000) <= 1280


def test_the_ml20m_preset_is_movielens_20m_shaped(script: ModuleType) -> None:
    a, counts = counts_of(script, ["x.csv", "--preset", "ml-20m"])
    assert (a.users, a.items) == (138_493, 26_744)
    assert abs(counts.sum() - 20_000_000) <= 0.01 * 20_000_000 and counts.min() >= 20
    assert f"{counts.sum():,} interactions, {counts.min()} to {counts.max():,} per user" in str(script.__doc__)


def test_flags_after_a_preset_override_it(script: ModuleType) -> None:
    a = script.parse(["x.csv", "--preset", "sparse-8k", "--min-interactions", "5", "--seed", "4"])
    assert (a.users, a.min_interactions, a.seed) == (8072, 5, 4)


def test_the_csv_is_the_same_for_every_block_size(script: ModuleType, tmp_path: Path) -> None:
    lines: list[tuple[int, int]] = []
    n = script.write_population(tmp_path / "a.csv", 300, 400, mean_interactions=5.0, min_interactions=3,
                                progress=lambda d, t: lines.append((d, t)))  # fmt: skip
    script.write_population(tmp_path / "b.csv", 300, 400, mean_interactions=5.0, min_interactions=3, block_users=17)
    a, b = (tmp_path / "a.csv").read_bytes(), (tmp_path / "b.csv").read_bytes()
    assert a == b and lines[0] == (0, 300) and lines[-1] == (300, 300)
    rows = np.loadtxt(tmp_path / "a.csv", delimiter=",", skiprows=1, dtype=np.int64)
    assert a.startswith(b"user,item,rating,timestamp\n") and len(rows) == n
    per_user = np.bincount(rows[:, 0], minlength=300)
    assert per_user.min() >= 3 and set(np.unique(rows[:, 2])) <= {1, 2, 3, 4, 5}


def test_main_writes_and_reports(script: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sub" / "pop.csv"
    script.main([str(out), "--users", "50", "--items", "300", "--mean-interactions", "4", "--min-interactions", "3",
                 "--block-users", "20", "--progress-every", "0"])  # fmt: skip
    got = capsys.readouterr()
    n = sum(1 for _ in out.open()) - 1
    assert got.out.strip() == f"{out}: 50 users, 300 items, {n} interactions"
    assert "users 20/50 (40.0%) chosen" in got.err and "users 50/50 (100.0%) chosen" in got.err


@pytest.mark.parametrize(
    ("flags", "msg"),
    [
        (["--min-interactions", "0"], "--min-interactions must be >= 1"),
        (["--min-interactions", "20", "--max-interactions", "10"], "--max-interactions (10) must be >= --min"),
        (["--items", "1"], "--items must be >= 2"),
        (["--users", "0", "--seed", "-1"], "--users must be >= 1, not 0; --seed must be >= 0"),
        (["--mean-interactions", "nan"], "--mean-interactions must be > 0"),
        (["--block-users", "0"], "--block-users must be >= 1"),
        (["--preset", "ml-30m"], "invalid choice: 'ml-30m'"),
    ],
)
def test_bad_input_is_a_clear_error(script: ModuleType, flags: list[str], msg: str, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    with pytest.raises(SystemExit) as e:
        script.parse([str(tmp_path / "x.csv"), *flags])
    assert e.value.code == 2 and msg in capsys.readouterr().err
