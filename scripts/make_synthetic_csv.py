"""Write a synthetic population as `user,item,rating,timestamp` CSV (for benchmarks).

The default is the long-tailed population `fedmask reference` is timed on
(docs/decisions.md, "EASE over a grid"): 8,000 users x 12,000 items, ~1.06M
interactions (median item 27 users, top 1% of items 25% of interactions).

    python scripts/make_synthetic_csv.py data/synthetic-8k.csv
    /usr/bin/time -v fedmask reference --dataset data/synthetic-8k.csv
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from models.data.synthetic import synthetic


def write_population(
    out: Path, users: int, items: int, *, mean_interactions: float = 110.0, max_interactions: int = 3000,
    popularity: float = 1.1, seed: int = 0,
) -> int:
    """Write a long-tailed synthetic population to `out` as user,item,rating,timestamp CSV;
    returns its number of interactions."""
    d = synthetic(
        users, items, seed=seed, mean_interactions=mean_interactions,
        max_interactions=max_interactions, popularity=popularity,
    )  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    table = np.stack([d.user, d.item, d.rating.astype(np.int64), d.timestamp], axis=1)
    np.savetxt(out, table, fmt="%d", delimiter=",", header="user,item,rating,timestamp", comments="")
    return len(d.user)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="CSV file to write")
    ap.add_argument("--users", type=int, default=8000)
    ap.add_argument("--items", type=int, default=12000)
    ap.add_argument("--mean-interactions", type=float, default=110.0)
    ap.add_argument("--max-interactions", type=int, default=3000)
    ap.add_argument("--popularity", type=float, default=1.1, help="Zipf-like exponent of item popularity")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    n = write_population(
        a.out, a.users, a.items, mean_interactions=a.mean_interactions, max_interactions=a.max_interactions,
        popularity=a.popularity, seed=a.seed,
    )  # fmt: skip
    print(f"{a.out}: {a.users} users, {a.items} items, {n} interactions")


if __name__ == "__main__":
    main()
