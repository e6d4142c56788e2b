"""The peer of `fedmask simulate --model fedmf`: a plain per-user PyTorch loop (timing only).

What a researcher writes without a batched engine: every round, for each user
in turn, copy the global item table, train the user's vector and the copy with
autograd and `torch.optim.SGD` for `--epochs` full-batch epochs over the user's
training positives and `--n-neg` fresh uniform negatives per positive (drawn
from the items the user has not trained on), BCE loss, then add the copy's
difference to the round's sum; the server takes the mean step. The sizes are
FedMF's defaults (k = 32, 10 epochs, 4 negatives, the same learning rates and
weight decay on the user vector), on the same leave-one-out split as
`fedmask simulate` (models.data.entry). The work per device is the same as
the engine's; the arithmetic is not checked against it (no validation, no
kept best round): this script measures seconds, not quality.

Prints one JSON line: the seconds of every round and their median after the
first.

    PYTHONPATH=. python scripts/peer_fedmf_loop.py --dataset ml-100k --rounds 5 --threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from models.data.entry import load_interactions, make_split
from models.data.types import ImplicitSplit


def one_round(split: ImplicitSplit, C: torch.Tensor, P: torch.Tensor, a: argparse.Namespace,
              candidates: list[torch.Tensor], gen: torch.Generator) -> torch.Tensor:
    """One round over every user, one at a time; updates P in place and returns the new global table."""
    total = torch.zeros_like(C)
    bce = torch.nn.BCEWithLogitsLoss()
    for u in range(split.n_users):
        pos = torch.from_numpy(split.train_items[split.train_indptr[u]:split.train_indptr[u + 1]])
        if len(pos) == 0:
            continue
        item = C.clone().requires_grad_(True)
        user = P[u].clone().requires_grad_(True)
        opt = torch.optim.SGD([{"params": [user], "lr": a.lr_user, "weight_decay": a.weight_decay_u},
                               {"params": [item], "lr": a.lr_item}])  # fmt: skip
        labels = torch.cat([torch.ones(len(pos)), torch.zeros(a.n_neg * len(pos))])
        for _ in range(a.epochs):
            cand = candidates[u]
            neg = cand[torch.randint(len(cand), (a.n_neg * len(pos),), generator=gen)]
            items = torch.cat([pos, neg])
            loss = bce(item[items] @ user, labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
        total += item.detach() - C
        P[u] = user.detach()
    return C + a.server_lr * total / split.n_users


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="ml-100k", help="a dataset name or file, as `fedmask simulate --dataset`")
    ap.add_argument("--data-dir", default=None, help="as `fedmask simulate --data-dir`")
    ap.add_argument("--rounds", type=int, default=5, help="rounds (the first is left out of the median)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the per-user tensors are small)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--n-neg", type=int, default=4)
    ap.add_argument("--lr-user", type=float, default=5.0)
    ap.add_argument("--lr-item", type=float, default=3.0)
    ap.add_argument("--weight-decay-u", type=float, default=0.03)
    ap.add_argument("--server-lr", type=float, default=10.0)
    a = ap.parse_args()
    if a.rounds < 2 or a.threads < 1:
        ap.error("--rounds must be >= 2 and --threads >= 1")
    torch.set_num_threads(a.threads)
    split = make_split(load_interactions(a.dataset, a.data_dir, a.seed), False, a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    C = 0.1 * torch.randn(split.n_items, a.k, generator=gen)
    P = 0.1 * torch.randn(split.n_users, a.k, generator=gen)
    candidates = []
    for u in range(split.n_users):
        allowed = np.ones(split.n_items, dtype=bool)
        allowed[split.train_items[split.train_indptr[u]:split.train_indptr[u + 1]]] = False
        candidates.append(torch.from_numpy(np.flatnonzero(allowed)))
    seconds = []
    for _ in range(a.rounds):
        t0 = time.perf_counter()
        C = one_round(split, C, P, a, candidates, gen)
        seconds.append(time.perf_counter() - t0)
    print(json.dumps({"peer": "plain per-user PyTorch loop (FedMF sizes)", "dataset": a.dataset,
                      "threads": a.threads, "round_seconds": seconds,
                      "median_after_first": statistics.median(seconds[1:])}))  # fmt: skip


if __name__ == "__main__":
    main()
