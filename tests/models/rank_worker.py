"""One rank of the distributed-simulation tests (tests/models/test_sim_ranks.py),
started by `fedmask.commands.simulate_ranks.launch_local` with torchrun's
variables. The spec (JSON) lists simulations of one synthetic population;
every rank runs them all as one process group, and rank 0 writes each run's
figures to <folder>/<i>.json (and its global model to <i>.npz). A job may
name a rank and a round at which that rank raises, to test how a failure
stops every rank."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def main(spec_path: str) -> int:
    from fedmask.commands.simulate_ranks import record_error
    from models.data.synthetic import synthetic
    from models.sim.engine import MemorySettings, SimulationConfig, simulate
    from models.sim.ranks import join, rank_of

    spec = json.loads(Path(spec_path).read_text())
    folder = Path(spec["folder"])
    place = rank_of(os.environ, cuda=False)
    try:
        ranks = join()
        x = synthetic(*spec["synthetic"], seed=spec["seed"])
        for i, job in enumerate(spec["jobs"]):
            def fail(rec: dict[str, Any], job: dict[str, Any] = job) -> None:
                if [place.rank, rec["round"]] == job.get("fail_at"):
                    raise RuntimeError(f"injected failure at round {rec['round']}")

            cfg = SimulationConfig(**job["config"], save_global=str(folder / f"{i}.npz"), threads=1)
            res = simulate(cfg, interactions=x, memory=MemorySettings(**job.get("memory", {})), ranks=ranks,
                           on_round=fail)
            if place.rank == 0:
                keep = {k: res[k] for k in ("best_round", "test", "ranks", "rounds")}
                (folder / f"{i}.json").write_text(json.dumps(keep, default=float))
        ranks.close()
    except BaseException as e:
        record_error(place.rank, e)
        return 1
    return 0


if __name__ == "__main__":
    from fedmask.commands.simulate_ranks import exit_rank

    exit_rank(main(sys.argv[1]))
