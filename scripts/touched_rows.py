"""How much of its item table a device touches, round after round (D89).

A device's training samples in a round are its positives and `n_neg` fresh
uniform negatives per positive and epoch. This draws exactly those negatives
(the keyed sampler every model uses, the whole population training every
round) and prints the share of the catalogue each device has touched: in one
round, and cumulatively after R rounds (what an exact sparse state of a
model that keeps every row a device ever touched, like FedRAP's D_i, would
hold), with the expectation of the plan's formula beside it.

    python scripts/touched_rows.py --dataset data/sparse.csv --epochs 10 --rounds 1 10 100
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from models.batched import negative_sampler, negative_samples, negatives_stream
from models.data.entry import load_interactions, make_split
from models.data.sampling import cohort_data
from models.sparse import touched_with_negatives


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="ml-100k")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=10, help="local epochs per round (FedRAP, FedMF: 10; PFedRec: 1)")
    ap.add_argument("--n-neg", type=int, default=4)
    ap.add_argument("--rounds", type=int, nargs="+", default=[1, 10, 100])
    a = ap.parse_args()
    x = load_interactions(a.dataset, None, a.seed)
    split = make_split(x, False, a.seed)
    m, n = split.n_items, split.n_users
    data = cohort_data(split, np.arange(n))
    sampler = negative_sampler(data, m, a.n_neg)
    seen = torch.zeros(n, m, dtype=torch.bool)
    seen[torch.nonzero(data.mask, as_tuple=True)[0], data.items[data.mask]] = True
    lengths = data.lengths
    print(f"# {x.name}: {n} devices, {m} items, {int(lengths.sum())} training positives; {a.epochs} epochs x "
          f"{a.n_neg} negatives per positive per round, every device every round")
    print("rounds  touched share of the catalogue per device: mean / median / p10 / p90 (expected mean)")
    for r in range(max(a.rounds)):
        for e in range(a.epochs):
            dev, item = negative_samples(data, m, a.n_neg, negatives_stream(a.seed, r, e), sampler)
            seen[dev, item] = True
        if r + 1 in a.rounds:
            share = seen.sum(1).to(torch.float64) / m
            q = share.quantile(torch.tensor([0.5, 0.1, 0.9], dtype=torch.float64))
            want = float((touched_with_negatives(lengths, m, a.n_neg * a.epochs * (r + 1)) / m).mean())
            print(f"{r + 1:>6}  {float(share.mean()):.3f} / {float(q[0]):.3f} / {float(q[1]):.3f} / {float(q[2]):.3f}"
                  f"  ({want:.3f})")


if __name__ == "__main__":
    main()
