"""The options of `fedmask client`, by topic (the command is fedmask/commands/client.py).

Each alias is a parameter's type and its `typer.Option`; its default stays in
the command's signature. `--help` lists the options in the signature's order,
grouped by their `rich_help_panel`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from secagg.stages import CLI_NAMES

STAGES = " | ".join(CLI_NAMES)

# ---------------------------------------------------------------- the process: coordinator, state, logs

CoordinatorOption = Annotated[
    str,
    typer.Option("--coordinator", "-c", help="Coordinator address HOST:PORT, or the replicas' addresses "
                 "comma-separated (HOST:PORT,HOST:PORT,...), tried in turn on each reconnect.", show_default=False),
]
StateDirOption = Annotated[
    Path,
    typer.Option(
        "--state-dir", "-s",
        help="Folder of the devices' private state (identity keys, enrolment, local ratings split, "
        "private model state, round secrets). Survives restarts; one process per folder.",
        show_default=False,
    ),
]
NameOption = Annotated[
    str | None, typer.Option(help="Client name shown to the coordinator (default: edge-HOSTNAME-PID).",
                             show_default=False)
]
ExitAfterRoundsOption = Annotated[
    int | None, typer.Option(min=1, help="Exit (code 0) after taking part in this many rounds.", show_default=False)
]
ThreadsOption = Annotated[
    int | None, typer.Option(min=1, help="Torch CPU threads (default: torch's choice).", show_default=False)
]
LogLevelOption = Annotated[str, typer.Option(help="debug | info | warning | error.")]

# ---------------------------------------------------------------- the hosted devices and their data

UsersOption = Annotated[
    str | None,
    typer.Option(
        "--users", "-u",
        help="Users of the dataset to host, one device each: N or ranges A-B, comma-separated "
        "(e.g. 1-100,200,300-310). 1-based positions in the dataset's user order (user N = "
        "dense id N-1; for MovieLens that is the raw user id N). Required unless --platform.",
        show_default=False,
    ),
]
DatasetOption = Annotated[
    str, typer.Option(help="Dataset name under --data-dir (ml-100k, ml-1m, ...), a folder or .csv, or 'synthetic'.")
]
DeviceOption = Annotated[str, typer.Option(help="Torch device for local training: cpu or cuda[:N].")]
SeedOption = Annotated[
    int,
    typer.Option(help="Seed of the dataset (synthetic) and local split, of the keyed training draws (private "
                 "initialisation, negatives: the same as `fedmask simulate --seed`), and of --drop-rate draws "
                 "(never of DP noise, encoding rounding or secagg secrets, which use os.urandom)."),
]

# ---------------------------------------------------------------- transport: TLS and the bearer token

TlsCaOption = Annotated[
    Path | None, typer.Option("--tls-ca", help="CA certificate (PEM) that signed the coordinator's certificate; "
                              "turns TLS on.", show_default=False)
]
TlsCertOption = Annotated[
    Path | None, typer.Option("--tls-cert", help="This client's certificate (PEM) for mTLS (with --tls-key).",
                              show_default=False)
]
TlsKeyOption = Annotated[Path | None, typer.Option("--tls-key", help="Private key (PEM) of --tls-cert.", show_default=False)]
TlsServerNameOption = Annotated[
    str | None, typer.Option("--tls-server-name", help="Expected name in the coordinator's certificate, when "
                             "it differs from HOST.", show_default=False)
]
TokenOption = Annotated[
    str | None,
    typer.Option(envvar="FEDMASK_TOKEN", help="Shared bearer token (token auth mode), sent as gRPC metadata "
                 "'authorization: Bearer ...'. Prefer the env var FEDMASK_TOKEN (not visible in ps).",
                 show_default=False),
]
InsecureTokenWithoutTlsOption = Annotated[
    bool, typer.Option("--insecure-token-without-tls", help="INSECURE: allow --token without --tls-ca to a "
                       "coordinator that is not on a loopback address; the bearer token then crosses the "
                       "network in clear. Refused without this flag.")
]

# ---------------------------------------------------------------- fault injection (tests and benchmarks)

DropRateOption = Annotated[
    float, typer.Option(min=0.0, max=1.0, help="Fault injection: each selected device drops (stops answering "
                        "for the rest of the round) with this probability at --drop-stage.")
]
DropStageOption = Annotated[
    str | None, typer.Option(help=f"Stage at which --drop-rate devices go silent: {STAGES}.", show_default=False)
]
FaultGarbageMetricsOption = Annotated[
    bool, typer.Option("--fault-garbage-metrics", help="Fault injection (a hostile device, for tests and "
                       "benchmarks): every device of this process puts 2^32 - 1 (-1 as an int32) in each of "
                       "its metric coordinates. The coordinator can only mark the round's metrics "
                       "unavailable.")
]
FaultForgedMetricOption = Annotated[
    list[str] | None, typer.Option("--fault-forged-metric", metavar="NAME=VALUE", help="Fault injection (a "
                                   "hostile device, for tests and benchmarks; repeatable): every device of this "
                                   "process reports VALUE for the round metric NAME instead of its own, not "
                                   "clamped to what one device may report (D35).")
]
FaultGarbageSharesOption = Annotated[
    bool, typer.Option("--fault-garbage-shares", help="Fault injection (a hostile device, for tests and "
                       "benchmarks): every device of this process seals random bytes instead of its shares, "
                       "so no peer can open them. Its peers report it at the share check (D37).")
]
FaultFalseReportsOption = Annotated[
    bool, typer.Option("--fault-false-reports", hidden=True, help="Fault injection (a hostile device, for tests and "
                       "benchmarks): every device of this process names every relayed sender undecryptable in its "
                       "share-check receipt, whether its shares opened or not (D37).")
]
FaultFalseReportsAboutOption = Annotated[
    str | None, typer.Option("--fault-false-reports-about", metavar="IDS", hidden=True, help="Fault injection (a "
                             "hostile device, for tests and benchmarks): every device of this process names the "
                             "relayed senders with these enrolled device ids (comma-separated) undecryptable in "
                             "its share-check receipt, and keeps its other edges (D37).", show_default=False)
]
CrashAfterRoundOption = Annotated[
    int | None, typer.Option(help="Fault injection: exit abruptly (os._exit, code 75) once round R (or a later "
                             "one) this process took part in has ended, its private state committed.",
                             show_default=False)
]
DelayMsOption = Annotated[float, typer.Option(min=0.0, help="Fault injection: wait this long before every stage reply.")]

# ---------------------------------------------------------------- the "Security" panel

MinCohortOption = Annotated[int | None, typer.Option(
    help="The devices withdraw from a round whose cohort is smaller (a cohort of two reveals each input to the "
    "other). Default 3; with --platform, --platforms (every platform of the federation).",
    rich_help_panel="Security", show_default=False)]
MinThresholdOption = Annotated[float, typer.Option(
    help="The devices withdraw from a round whose Shamir threshold is not above this fraction of the group its "
    "shares go to (0.5 = at least a strict majority; e.g. 0.66 in active mode).", rich_help_panel="Security")]
MinDpOption = Annotated[str, typer.Option(
    help="The devices withdraw from a task whose DP mechanism is weaker: none < distributed < local "
    "(docs/decisions.md D85).", rich_help_panel="Security")]
MinNoiseMultiplierOption = Annotated[float, typer.Option(
    min=0.0, help="The devices withdraw from a task whose noise multiplier z is lower, counted from the noise the "
    "device would actually add (std / clip, times sqrt(cohort) for distributed noise), not from what the task "
    "claims.", rich_help_panel="Security")]
MaxDpClipOption = Annotated[float | None, typer.Option(
    help="The devices withdraw from a task whose DP clip is larger. Default: no cap (the noise scales with the "
    "clip).", rich_help_panel="Security", show_default=False)]
MaxRoundsPerHourOption = Annotated[int, typer.Option(
    min=0, help="The devices contribute to at most this many rounds an hour (0: no cap), and never twice to one "
    "model and task, so a coordinator cannot difference two rounds that differ by one device (docs/decisions.md "
    "D85).", rich_help_panel="Security")]
NoDpFloorOption = Annotated[bool, typer.Option(
    "--no-dp-floor", help="INSECURE (tests and benchmarks of models without DP): accept any DP setting, DP off "
    "included. A coordinator can then difference two rounds' sums and read one device's update.",
    rich_help_panel="Security")]
ServeRecommendationsOption = Annotated[bool, typer.Option(
    "--serve-recommendations/--no-serve-recommendations",
    help="Answer the coordinator's top-k requests for the hosted devices' users (computed on the device). "
         "With --no-serve-recommendations every such request is refused with DEVICE_ERROR_CODE_REFUSED "
         "(the admin API answers 403).", rich_help_panel="Security")]
MaxTopKOption = Annotated[int, typer.Option(
    min=1, max=10_000,
    help="The most items a device's top-k answer holds, whatever k the request asks for (docs/decisions.md D84). "
         "Answers carry ranked items, never the device's scores.", rich_help_panel="Security")]
RecommendSeenItemsOption = Annotated[bool, typer.Option(
    "--recommend-seen-items/--no-recommend-seen-items",
    help="Let a top-k request ask for the items the user already rated (exclude_seen=false). Off by default: the "
         "seen items are always left out (the answer says so), because the difference between an answer with them "
         "and one without is the user's rating history.", rich_help_panel="Security")]
DeviceCaOption = Annotated[Path | None, typer.Option(
    help="The federation's device CA certificate (PEM; `fedmask certs init` writes device-ca.pem), kept apart "
    "from the coordinator: the devices join only active-mode rounds, and only with peers whose identity "
    "certificates this CA issued. Devices without a certificate write a request to sign (fedmask certs "
    "issue-device).", rich_help_panel="Security", show_default=False)]
UnprotectedPlaintextJBoundOption = Annotated[float | None, typer.Option(
    help="UNPROTECTED UPDATES (FedMMF hybrid rounds, docs/decisions.md D64): in a round whose coordinator allows "
    "it, a device whose privacy indicator J (the mean squared residual of its personalised mask on its own "
    "ratings) is at most this AND at most the round's bound sends its item-factor update in PLAINTEXT: the "
    "coordinator learns it. Needs --tls-ca. Default: never; every update is masked.",
    rich_help_panel="Security", show_default=False)]

# ---------------------------------------------------------------- the "Cross-silo (FREIB)" panel

PlatformOption = Annotated[int | None, typer.Option(
    help="Cross-silo FREIB: host platform P (1-based) of --platforms M as ONE device holding all its users' "
    "ratings, instead of --users. The split is FREIB's Dirichlet label skew of the dataset with --seed, the same "
    "as `fedmask simulate --platforms M --dirichlet-beta B --seed S`. The coordinator must run --model freib.",
    rich_help_panel="Cross-silo (FREIB)", show_default=False)]
PlatformsOption = Annotated[int, typer.Option(
    help="Number of platforms M of the split (with --platform).", rich_help_panel="Cross-silo (FREIB)")]
DirichletBetaOption = Annotated[float, typer.Option(
    help="Dirichlet parameter beta of the platform split (with --platform; smaller = more label skew).",
    rich_help_panel="Cross-silo (FREIB)")]

# ---------------------------------------------------------------- the "Debug" panel

DebugRecordInputsOption = Annotated[
    bool, typer.Option("--debug-record-inputs", help="DEBUG ONLY (loopback coordinator): write each device's "
                       "encoded input of every round to STATE_DIR/debug/inputs/ (owner-only: 0700 folders, 0600 files; "
                       "each is the device's update in the clear), so tests and benchmarks can check the "
                       "aggregate exactly.", rich_help_panel="Debug")
]
DebugAllowInsecurePlaintextOption = Annotated[
    bool, typer.Option("--debug-allow-insecure-plaintext", help="INSECURE, benchmarks only (loopback "
                       "coordinator): answer the coordinator's plaintext rounds (--debug-insecure-plaintext) "
                       "with UNMASKED updates. Without it such rounds are refused.", rich_help_panel="Debug")
]
