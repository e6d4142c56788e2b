"""Per-device cost of one FedRAP `local_update` (tuned defaults) at several catalogue sizes.

A round's training cost is (devices in the cohort) x (this per-device cost):
devices are batched with no term across devices. Prints measured milliseconds
per device for synthetic devices of 110 training items each.

    PYTHONPATH=. OMP_NUM_THREADS=1 python scripts/fedrap_round_cost.py --items 1682,3706,12000
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from models.base import CohortData
from models.batched import negative_counts
from models.fedrap import FedRAP


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", default="1682,3706,12000", help="comma-separated catalogue sizes")
    ap.add_argument("--devices", type=int, default=128, help="devices per timed local_update call")
    ap.add_argument("--history", type=int, default=110, help="training items per device")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    b, hist = a.devices, a.history
    for m in (int(v) for v in a.items.split(",")):
        rng = np.random.default_rng(0)
        items = torch.from_numpy(np.stack([rng.choice(m, hist, replace=False) for _ in range(b)])).long()
        data = CohortData(
            users=torch.arange(b), items=items, mask=torch.ones(b, hist, dtype=torch.bool),
            lengths=torch.full((b,), hist),
        )  # fmt: skip
        model = FedRAP(b, m)
        g = model.init_global(torch.Generator().manual_seed(0))
        priv = model.init_private(data, g, 0)
        model.local_update(g, priv, data, 5, 0)  # warm-up
        t = time.perf_counter()
        model.local_update(g, priv, data, 5, 0)
        tl = time.perf_counter() - t
        t = time.perf_counter()
        negative_counts(data, m, model.n_neg, model.local_epochs, seed=0, round_idx=5)
        tn = time.perf_counter() - t
        print(
            f"items {m}: local_update {tl / b * 1000:.2f} ms per device "
            f"(drawing the negatives {tn / b * 1000:.2f} ms of it), {tl:.2f} s for {b} devices"
        )


if __name__ == "__main__":
    main()
