"""The ranks of a distributed simulation and the few collectives they use
(torch.distributed; D93).

A rank learns its place from the environment torchrun sets (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT); the
`--nproc N` launcher (fedmask/commands/simulate_ranks.py) sets the same
variables, so both start the same way. The backend is gloo on the CPU and
NCCL when the simulation runs on a GPU (one rank per GPU: rank r uses
cuda:LOCAL_RANK).

What crosses ranks, per round (models/sim/rank_round.py):
- `sum_f64`: one all_reduce of a float64 vector: the summed update, the
  device count and, on evaluated rounds, the metric sums (a second call:
  they are measured on the model the first one produced). Every rank
  receives the same reduced values (a reduce-scatter then an all-gather:
  each element is added once), so every rank applies the same server step.
- `sum_i64`: the secure sum's group sums, exact integers, reduced mod 2^w
  by the caller.
- `gather`: small Python objects (per-rank figures, the checks at the end).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

#: how long a collective may wait for a missing rank before it fails (gloo's own default is 30 min)
DEFAULT_TIMEOUT_S = 600


class RankError(RuntimeError):
    """Something went wrong on this rank; its message starts with the rank."""


@dataclass
class Ranks:
    """This process's place among the ranks, and the collectives (a live
    default process group when world > 1)."""

    rank: int
    world: int
    local_rank: int = 0
    local_world: int = 1
    backend: str = "none"

    @property
    def device(self) -> torch.device:
        """Where collectives run: the rank's GPU under NCCL, else the CPU."""
        return torch.device("cuda", self.local_rank) if self.backend == "nccl" else torch.device("cpu")

    def sum_f64(self, t: torch.Tensor) -> torch.Tensor:
        """The element-wise sum over ranks of a vector, in float64 (on t's device)."""
        x = t.detach().to(self.device, torch.float64).contiguous()
        if self.world > 1:
            import torch.distributed as dist

            dist.all_reduce(x, op=dist.ReduceOp.SUM)
        return x.to(t.device)

    def sum_i64(self, t: torch.Tensor) -> torch.Tensor:
        """The element-wise sum over ranks of an int64 vector (exact)."""
        x = t.detach().to(self.device, torch.int64).contiguous()
        if self.world > 1:
            import torch.distributed as dist

            dist.all_reduce(x, op=dist.ReduceOp.SUM)
        return x.cpu()

    def sum_dict(self, sums: Mapping[str, float]) -> dict[str, float]:
        """Metric sums added over ranks, key by key (every rank has the same keys)."""
        keys = sorted(sums)
        total = self.sum_f64(torch.tensor([float(sums[k]) for k in keys], dtype=torch.float64))
        return {k: float(v) for k, v in zip(keys, total.tolist(), strict=True)}

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order (pickled: small objects only)."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def in_rank_environment(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process was started as a rank (torchrun or `--nproc`)."""
    e = os.environ if env is None else env
    return "RANK" in e and "WORLD_SIZE" in e


def rank_of(env: Mapping[str, str], *, cuda: bool) -> Ranks:
    """This process's place, read from torchrun's variables (ValueError when they are malformed)."""
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local_rank = int(env.get("LOCAL_RANK", "0"))
        local_world = int(env.get("LOCAL_WORLD_SIZE", "1"))
    except (KeyError, ValueError) as e:
        raise ValueError(f"RANK, WORLD_SIZE, LOCAL_RANK must be integers: {e}") from None
    if not (world >= 1 and 0 <= rank < world and 0 <= local_rank < max(local_world, 1)):
        raise ValueError(f"rank {rank} of {world} (local {local_rank} of {local_world}) is not a place")
    backend = "none" if world == 1 else ("nccl" if cuda else "gloo")
    return Ranks(rank, world, local_rank, local_world, backend)


def join(env: Mapping[str, str] | None = None, *, cuda: bool = False, timeout_s: int = DEFAULT_TIMEOUT_S) -> Ranks:
    """Join the ranks named by the environment (the default process group,
    rendezvous at MASTER_ADDR:MASTER_PORT); a single rank joins nothing.

    The rendezvous keys are prefixed with torchrun's restart count: after
    torchrun restarts the workers (--max-restarts), its store still holds the
    previous attempt's addresses, which the new ranks must not read. Under
    torchrun the agent hosts the store; under `--nproc` rank 0 does."""
    e = os.environ if env is None else env
    ranks = rank_of(e, cuda=cuda)
    if ranks.world > 1:
        import torch.distributed as dist

        if cuda:
            torch.cuda.set_device(ranks.local_rank)
        timeout = datetime.timedelta(seconds=timeout_s)
        try:
            host, port = e["MASTER_ADDR"], int(e["MASTER_PORT"])
        except (KeyError, ValueError) as err:
            raise ValueError(f"MASTER_ADDR and MASTER_PORT must name the rendezvous: {err}") from None
        agent_store = e.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        store = dist.TCPStore(host, port, world_size=ranks.world, is_master=ranks.rank == 0 and not agent_store,
                              timeout=timeout, multi_tenant=not agent_store)  # fmt: skip
        prefixed = dist.PrefixStore(f"fedmask/attempt-{e.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
        dist.init_process_group(backend=ranks.backend, store=prefixed, rank=ranks.rank, world_size=ranks.world,
                                timeout=timeout)  # fmt: skip
    return ranks


T = TypeVar("T")


def recorded(fn: Callable[[], T]) -> T | None:
    """fn() under torchrun's error recording (`torch.distributed.elastic`'s
    `record`): an exception also goes to the error file torchrun names, so
    its summary shows the failing rank and the error."""
    from torch.distributed.elastic.multiprocessing.errors import record

    return record(fn)()
