"""The options of `fedmask simulate`, by topic (the command is fedmask/commands/simulate.py).

Each alias is a parameter's type and its `typer.Option`; its default stays in
the command's signature. `--help` lists the options in the signature's order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

# ---------------------------------------------------------------- the run: model, data, rounds, output

ModelOption = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="fedrap | fedmmf | pfedrec | fedmf (device level); freib | central-mf (platform level, "
        "see --platforms).",
        show_default=False,
    ),
]
OutOption = Annotated[Path, typer.Option("--out", "-o", help="Output folder for results.json and metrics.png.")]
SeedOption = Annotated[int, typer.Option(help="Seed of the split, the initialisation, the cohorts and the noise.")]
RoundsOption = Annotated[
    int | None, typer.Option(help="Federated rounds (default: the model's tuned number).", show_default=False)
]
ClientsPerRoundOption = Annotated[
    int | None,
    typer.Option(help="Devices per round, drawn uniformly (default: every device every round).", show_default=False),
]
DeviceOption = Annotated[str, typer.Option(help="cpu or cuda.")]
ExplicitOption = Annotated[
    bool, typer.Option("--explicit", help="Explicit ratings (fedmf only; fedmmf is always explicit): MSE, RMSE/MAE.")
]
EvalEveryOption = Annotated[int, typer.Option(help="Evaluate on validation every E rounds (and after the last).")]
FullValOption = Annotated[
    bool, typer.Option("--full-val", help="Also rank all items on validation every evaluation (slower).")
]
ThreadsOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="torch CPU threads (default: the cores that are free: usable cores minus the 1-minute load "
        "average, at least 1; printed before training and recorded in results.json). torch's threads spin "
        "while they wait for a busy core, so more threads than free cores can be many times slower.",
        show_default=False,
    ),
]
ParamOption = Annotated[
    list[str] | None,
    typer.Option(
        "--param",
        "-p",
        help="Override a model hyperparameter, KEY=VALUE (repeatable), e.g. -p k=16 -p lr_item=0.3.",
        show_default=False,
    ),
]
UsersOption = Annotated[
    str | None,
    typer.Option(
        help="Simulate only these devices, as an edge client's --users (1-based user numbers, e.g. 1-30); "
        "default: every user of the dataset. Metrics are over these devices.",
        show_default=False,
    ),
]
SaveGlobalOption = Annotated[
    Path | None,
    typer.Option(
        help="Write the final global model (after the last round) to this .npz file, one float32 array "
        "per parameter (e.g. FedRAP's C), to compare with a federation's committed version.",
        show_default=False,
    ),
]
QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]

# ---------------------------------------------------------------- secure aggregation

SecAggOption = Annotated[
    bool, typer.Option("--secagg/--no-secagg", help="Aggregate through the real SecAgg+ protocol, in process.")
]
SecAggNeighborsOption = Annotated[
    str | None,
    typer.Option(
        help="SecAgg+ graph degree (even int) or 'all' for the complete graph (default: 'auto', "
        "the secagg package's SecAgg+ choice for the cohort size).",
        show_default=False,
    ),
]
SecAggClipOption = Annotated[
    float | None,
    typer.Option(
        help="SecAgg fixed-point range [-c, c] of every coordinate (default: tau*(1+6z) with DP, else 32).",
        show_default=False,
    ),
]
GroupSizeOption = Annotated[
    int | None,
    typer.Option(
        "--group-size",
        help="Secure aggregation in groups (D87): a cohort of 2G devices or more is split into balanced "
        "groups of at least G, one SecAgg+ instance each, and their sums added (one encoding for the "
        "cohort); a smaller cohort is one group. The server learns each group's sum; with --dp-mode "
        "distributed each device's noise is sized for its group, so the model's noise grows with the "
        "square root of the number of groups. Needs --secagg (default: 500).",
        show_default=False,
    ),
]
PlaintextJBoundOption = Annotated[
    float | None,
    typer.Option(
        help="FedMMF hybrid rounds, UNPROTECTED updates: a device whose privacy indicator J (the mean "
        "squared residual of its personalised mask on its own ratings) is at most this sends its "
        "item-factor update in plaintext; the others go through the secure sum (--secagg) and the "
        "round sums both. Off by default; not with --dp-mode distributed. See docs/decisions.md D64.",
        show_default=False,
    ),
]

# ---------------------------------------------------------------- differential privacy (Gaussian)

DpNoiseOption = Annotated[
    float | None,
    typer.Option(help="DP noise multiplier z (noise std z * tau per coordinate). Needs --dp-clip.", show_default=False),
]
DpClipOption = Annotated[
    float | None,
    typer.Option(
        help="DP clipping norm tau of every device's update. FedRAP sends (C_i - C) / update_scale, so tau is in "
        "that unit: -p update_scale=70 is the validation-tuned unit for tau 0.1, z 1 with --dp-mode distributed "
        "(docs/tuning.md).",
        show_default=False,
    ),
]
DpDeltaOption = Annotated[float, typer.Option(help="delta of the reported (epsilon, delta).")]
UnmaskedSumOption = Annotated[
    bool,
    typer.Option(
        "--unmasked-sum",
        help="With --dp-mode distributed: the sum the secure aggregation would release, computed mod 2^w without "
        "its masks (they cancel exactly), each group's noise drawn at once (D95). For privacy-quality studies "
        "that cannot afford the protocol; same epsilon. Not with --secagg.",
    ),
]
DpMechanismOption = Annotated[
    str,
    typer.Option(
        help="discrete-gaussian: the devices' mechanism (D88): L2 clip, rotation, scaling, rounding under the "
        "norm bound and integer noise in the secure sum's field (drawn here from a seeded sampler of the same "
        "law), epsilon from its own zCDP bound; gaussian-float: the float path, its epsilon APPROXIMATE. "
        "Epsilon is reported without amplification by sampling.",
    ),
]
DpAccountantOption = Annotated[str, typer.Option(help="Privacy accountant: rdp or pld (dp-accounting).")]
DpModeOption = Annotated[
    str,
    typer.Option(
        help="local: every device adds N(0, (z tau)^2); distributed: N(0, (z tau)^2 / n) each, n the "
        "device's secure-aggregation group (the cohort below 2 --group-size), so only each group's sum "
        "carries the full noise (needs --secagg)."
    ),
]

# ---------------------------------------------------------------- memory (models/sim/memory.py)

MemoryGbOption = Annotated[
    float | None,
    typer.Option(
        help="Memory budget in GiB (default: 90 % of the memory available at the start). The footprint "
        "is estimated and printed before training; a round's cohort is then trained in chunks and the "
        "private state kept in memory-mapped files when needed, or the run refuses with the size it needs.",
        show_default=False,
    ),
]
CohortChunkOption = Annotated[
    int | None,
    typer.Option(
        help="Train at most N devices per batched call (default: the most the budget allows). Changes "
        "nothing but memory and speed (float32 summation order).",
        show_default=False,
    ),
]
PrivateStateOption = Annotated[
    str,
    typer.Option(
        help="How the devices' private state is kept: auto (sparse for fedmf and pfedrec, implicit: only the "
        "rows each device touched; otherwise RAM if it fits, else disk), sparse, memory (dense tables in RAM) "
        "or disk (dense tables in memory-mapped files)."
    ),
]
PlanOnlyOption = Annotated[
    bool,
    typer.Option(
        "--plan-only",
        help="Print the memory plan and the private state's expected bytes as a function of rounds, then "
        "stop without training.",
    ),
]
StateDirOption = Annotated[
    Path | None,
    typer.Option(
        help="Folder for the memory-mapped private state (default: the temporary directory); removed "
        "at the end.",
        show_default=False,
    ),
]

# ---------------------------------------------------------------- platform level (FREIB's setting)

PlatformsOption = Annotated[
    int | None,
    typer.Option(
        help="Platform-level federation (FREIB's setting): M platforms, each holding all ratings of its "
        "users, made by Dirichlet label skew. Implied by --model freib (default 5 there) and "
        "--model central-mf; with fedmf or pfedrec it runs them on the same platforms (explicit ratings).",
        show_default=False,
    ),
]
DirichletBetaOption = Annotated[
    float, typer.Option(help="Dirichlet parameter beta of the platform split (smaller = more label skew).")
]
AblateOption = Annotated[
    list[str] | None,
    typer.Option(
        help="FREIB ablation, repeatable: bias (no item-bias encoder, no prototypes), guidance (no global "
        "knowledge guidance), prototypes (no prototype alignment).",
        show_default=False,
    ),
]
LdpScaleOption = Annotated[
    float | None,
    typer.Option(
        help="Platform level: the FREIB paper's Laplace local DP, noise Laplace(0, LAMBDA) on every "
        "uploaded coordinate. Needs --ldp-clip.",
        show_default=False,
    ),
]
LdpClipOption = Annotated[
    float | None,
    typer.Option(
        help="Platform level: L1 bound C of every upload before the Laplace noise; epsilon per release "
        "= 2C / LAMBDA (printed; separate from the Gaussian --dp-* ledger).",
        show_default=False,
    ),
]
NprocOption = Annotated[
    int | None,
    typer.Option(
        "--nproc",
        min=1,
        help="Run the simulation as N local ranks (torch.distributed: gloo on the CPU, NCCL with --device cuda, one "
        "rank per GPU). Each rank holds and trains its shard of the devices; one all_reduce per round adds their "
        "updates exactly (docs/simulating.md, 'Simulating at scale'). --nproc 1: one rank in this process, the "
        "run N ranks reproduce. With --plan-only: each rank's memory needs. Under torchrun leave it out: the "
        "ranks come from torchrun's RANK and WORLD_SIZE.",
        show_default=False,
    ),
]
CheckpointEveryOption = Annotated[
    int | None,
    typer.Option(
        "--checkpoint-every",
        min=1,
        help="Write a checkpoint every K rounds into --checkpoint-dir (the global model, the ledger, the records and "
        "each rank's shard of the private state). A run started with a folder that holds a checkpoint of the same "
        "settings resumes from its latest one, e.g. after torchrun restarts a failed rank (--max-restarts).",
        show_default=False,
    ),
]
CheckpointDirOption = Annotated[
    Path | None,
    typer.Option("--checkpoint-dir", help="Folder of the checkpoints (with --checkpoint-every).", show_default=False),
]
