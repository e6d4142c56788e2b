"""How much memory FedRAP's local training takes, and how many devices an inner
chunk holds on an accelerator: pure arithmetic over a `models.fedrap.FedRAP`'s
sizes, for the simulator's memory plan (models/sim/memory.py, D70, D102).

Contract: every figure is an upper estimate of what `FedRAP.local_update`
holds at once; the plan's tests (tests/models/test_engine_memory.py) and the
measured runs in docs/performance.md check it against peak RSS.
"""

from __future__ import annotations

from typing import Protocol

import torch


class FedRAP(Protocol):
    """The sizes of a `models.fedrap.FedRAP` this module reads."""

    n_items: int
    k: int
    n_neg: int
    local_epochs: int
    chunk: int

    @property
    def has_c(self) -> bool: ...

    @property
    def has_d(self) -> bool: ...

    @property
    def update_dim(self) -> int: ...

    def sums_updates(self) -> bool: ...


CHUNKS_PER_DRAW = 16  # inner chunks whose negatives are drawn together (the sampler's setup is per draw)


def chunk_bytes(model: FedRAP, history: int) -> int:
    """Scratch bytes one device of an inner chunk needs when devices hold
    `history` training positives: the accumulator A, the regulariser temporary
    and C_i - C (m*k floats each), its group's negative counts (E*m bytes) and
    one epoch's sample tensors."""
    m, k = model.n_items, model.k
    samples = (1 + model.n_neg) * history * (3 * 4 * k + 64)
    return 3 * 4 * m * k + model.local_epochs * m + 8 * m + samples


def accelerator_chunk(model: FedRAP, nb: int, positives: int, device: torch.device) -> int:
    """Devices per inner chunk on an accelerator, for a cohort of `nb` devices with
    `positives` training positives in all: as many as a quarter of its free memory
    holds (sized at twice the mean history; at least `chunk` and 64, at most the
    cohort). Each device's rows are its own, so the chunk changes the number of
    kernel launches, not what is computed."""
    floor = max(model.chunk, 64)
    if device.type != "cuda":
        return floor
    free, _total = torch.cuda.mem_get_info(device)
    history = 2 * -(-positives // max(1, nb))
    fits = int(free // 4) // max(1, chunk_bytes(model, history))
    return max(1, min(nb, max(floor, fits)))


def train_memory(model: FedRAP, private_bytes: int, max_history: int, *, in_place: bool = False,
                 summed: bool = False) -> tuple[int, int]:
    """(fixed, per_device) bytes of local_update (see
    FederatedRecommender.train_memory): per device the taken private rows and
    the new D_i (none of them `in_place`: the rows are the state itself, written
    over), the update (m*k floats; none when `summed` by the compiled kernel)
    and its positives; fixed, for each of the worker threads: a group's negative
    counts (E*m bytes per device), for its chunk in training the accumulator A,
    the regulariser temporary and C_i - C when item biases are on (m*k floats
    per device each) and one epoch's sample tensors, and its float64 partial sum
    when summed."""
    m, k, n_ep = model.n_items, model.k, model.local_epochs
    table = 4 * m * k
    summed = summed and model.sums_updates()
    per = 0 if in_place else private_bytes + (table if model.has_d else 0)
    per += (table if model.has_c and not summed else 0) + 12 * m + 16 * (1 + model.n_neg) * max_history
    samples = (1 + model.n_neg) * max_history * (3 * 4 * k + 64)
    group = CHUNKS_PER_DRAW * model.chunk * (n_ep * m + 8 * m)
    partial = 8 * model.update_dim if summed else 0
    fixed = max(1, torch.get_num_threads()) * (group + model.chunk * (3 * table + 24 * m + samples) + partial)
    return fixed, per
