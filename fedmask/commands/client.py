"""`fedmask client`: an edge-client process hosting one or many devices (edge_client/)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from secagg.stages import CLI_NAMES

_STAGES = " | ".join(CLI_NAMES)


def register(app: typer.Typer) -> None:
    """Attach `fedmask client` to the root app."""
    app.command("client")(client)


def client(
    coordinator: Annotated[
        str, typer.Option("--coordinator", "-c", help="Coordinator address HOST:PORT.", show_default=False)
    ],
    state_dir: Annotated[
        Path,
        typer.Option(
            "--state-dir", "-s",
            help="Folder of the devices' private state (identity keys, enrolment, local ratings split, "
            "private model state, round secrets). Survives restarts; one process per folder.",
            show_default=False,
        ),
    ],
    users: Annotated[
        str | None,
        typer.Option(
            "--users", "-u",
            help="Users of the dataset to host, one device each: N or ranges A-B, comma-separated "
            "(e.g. 1-100,200,300-310). 1-based positions in the dataset's user order (user N = "
            "dense id N-1; for MovieLens that is the raw user id N). Required unless --platform.",
            show_default=False,
        ),
    ] = None,
    dataset: Annotated[
        str, typer.Option(help="Dataset name under --data-dir (ml-100k, ml-1m, ...), a folder or .csv, or 'synthetic'.")
    ] = "ml-100k",
    data_dir: Annotated[
        Path | None,
        typer.Option("--data-dir", envvar="FEDMASK_DATA_DIR", help="Folder holding the datasets (default: ./data).",
                     show_default=False),
    ] = None,
    device: Annotated[str, typer.Option(help="Torch device for local training: cpu or cuda[:N].")] = "cpu",
    seed: Annotated[
        int,
        typer.Option(help="Seed of the dataset (synthetic) and local split, of the keyed training draws (private "
                     "initialisation, negatives: the same as `fedmask simulate --seed`), and of --drop-rate draws "
                     "(never of DP noise, encoding rounding or secagg secrets, which use os.urandom)."),
    ] = 0,
    name: Annotated[
        str | None, typer.Option(help="Client name shown to the coordinator (default: edge-HOSTNAME-PID).",
                                 show_default=False)
    ] = None,
    tls_ca: Annotated[
        Path | None, typer.Option("--tls-ca", help="CA certificate (PEM) that signed the coordinator's certificate; "
                                  "turns TLS on.", show_default=False)
    ] = None,
    tls_cert: Annotated[
        Path | None, typer.Option("--tls-cert", help="This client's certificate (PEM) for mTLS (with --tls-key).",
                                  show_default=False)
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option("--tls-key", help="Private key (PEM) of --tls-cert.", show_default=False)
    ] = None,
    tls_server_name: Annotated[
        str | None, typer.Option("--tls-server-name", help="Expected name in the coordinator's certificate, when "
                                 "it differs from HOST.", show_default=False)
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(envvar="FEDMASK_TOKEN", help="Shared bearer token (token auth mode), sent as gRPC metadata "
                     "'authorization: Bearer ...'. Prefer the env var FEDMASK_TOKEN (not visible in ps).",
                     show_default=False),
    ] = None,
    insecure_token_without_tls: Annotated[
        bool, typer.Option("--insecure-token-without-tls", help="INSECURE: allow --token without --tls-ca to a "
                           "coordinator that is not on a loopback address; the bearer token then crosses the "
                           "network in clear. Refused without this flag.")
    ] = False,
    drop_rate: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Fault injection: each selected device drops (stops answering "
                            "for the rest of the round) with this probability at --drop-stage.")
    ] = 0.0,
    drop_stage: Annotated[
        str | None, typer.Option(help=f"Stage at which --drop-rate devices go silent: {_STAGES}.", show_default=False)
    ] = None,
    fault_garbage_metrics: Annotated[
        bool, typer.Option("--fault-garbage-metrics", help="Fault injection (a hostile device, for tests and "
                           "benchmarks): every device of this process puts 2^32 - 1 (-1 as an int32) in each of "
                           "its metric coordinates. The coordinator can only mark the round's metrics "
                           "unavailable.")
    ] = False,
    fault_garbage_shares: Annotated[
        bool, typer.Option("--fault-garbage-shares", help="Fault injection (a hostile device, for tests and "
                           "benchmarks): every device of this process seals random bytes instead of its shares, "
                           "so no peer can open them. Its peers report it at the share check (D37).")
    ] = False,
    crash_after_round: Annotated[
        int | None, typer.Option(help="Fault injection: exit abruptly (os._exit, code 75) once round R (or a later "
                                 "one) this process took part in has ended, its private state committed.",
                                 show_default=False)
    ] = None,
    delay_ms: Annotated[
        float, typer.Option(min=0.0, help="Fault injection: wait this long before every stage reply.")
    ] = 0.0,
    exit_after_rounds: Annotated[
        int | None, typer.Option(min=1, help="Exit (code 0) after taking part in this many rounds.",
                                 show_default=False)
    ] = None,
    threads: Annotated[
        int | None, typer.Option(min=1, help="Torch CPU threads (default: torch's choice).", show_default=False)
    ] = None,
    min_cohort: Annotated[int | None, typer.Option(help="The devices withdraw from a round whose cohort is smaller (a cohort of two reveals each input to the other). Default 3; with --platform, --platforms (every platform of the federation).", rich_help_panel="Security", show_default=False)] = None,
    platform: Annotated[int | None, typer.Option(help="Cross-silo FREIB: host platform P (1-based) of --platforms M as ONE device holding all its users' ratings, instead of --users. The split is FREIB's Dirichlet label skew of the dataset with --seed, the same as `fedmask simulate --platforms M --dirichlet-beta B --seed S`. The coordinator must run --model freib.", rich_help_panel="Cross-silo (FREIB)", show_default=False)] = None,
    platforms: Annotated[int, typer.Option(help="Number of platforms M of the split (with --platform).", rich_help_panel="Cross-silo (FREIB)")] = 5,
    dirichlet_beta: Annotated[float, typer.Option(help="Dirichlet parameter beta of the platform split (with --platform; smaller = more label skew).", rich_help_panel="Cross-silo (FREIB)")] = 1.0,
    min_threshold: Annotated[float, typer.Option(help="The devices withdraw from a round whose Shamir threshold is not above this fraction of the group its shares go to (0.5 = at least a strict majority; e.g. 0.66 in active mode).", rich_help_panel="Security")] = 0.5,
    serve_recommendations: Annotated[bool, typer.Option(
        "--serve-recommendations/--no-serve-recommendations",
        help="Answer the coordinator's top-k requests for the hosted devices' users (computed on the device). "
             "With --no-serve-recommendations every such request is refused with DEVICE_ERROR_CODE_REFUSED "
             "(the admin API answers 403).", rich_help_panel="Security")] = True,
    device_ca: Annotated[Path | None, typer.Option(help="The federation's device CA certificate (PEM; `fedmask certs init` writes device-ca.pem), kept apart from the coordinator: the devices join only active-mode rounds, and only with peers whose identity certificates this CA issued. Devices without a certificate write a request to sign (fedmask certs issue-device).", rich_help_panel="Security", show_default=False)] = None,
    unprotected_plaintext_j_bound: Annotated[float | None, typer.Option(help="UNPROTECTED UPDATES (FedMMF hybrid rounds, docs/decisions.md D64): in a round whose coordinator allows it, a device whose privacy indicator J (the mean squared residual of its personalised mask on its own ratings) is at most this AND at most the round's bound sends its item-factor update in PLAINTEXT: the coordinator learns it. Needs --tls-ca. Default: never; every update is masked.", rich_help_panel="Security", show_default=False)] = None,
    log_level: Annotated[str, typer.Option(help="debug | info | warning | error.")] = "info",
    debug_record_inputs: Annotated[
        bool, typer.Option("--debug-record-inputs", help="DEBUG ONLY (loopback coordinator): write each device's "
                           "encoded input of every round to STATE_DIR/debug/inputs/, so tests and benchmarks can "
                           "check the aggregate exactly.", rich_help_panel="Debug")
    ] = False,
    debug_allow_insecure_plaintext: Annotated[
        bool, typer.Option("--debug-allow-insecure-plaintext", help="INSECURE, benchmarks only (loopback "
                           "coordinator): answer the coordinator's plaintext rounds (--debug-insecure-plaintext) "
                           "with UNMASKED updates. Without it such rounds are refused.", rich_help_panel="Debug")
    ] = False,
) -> None:
    """Host devices of a dataset, enrol them, and train with the coordinator.

    One process hosts one device per selected user. The devices are enrolled once (the result is kept in --state-dir), one Session stream is opened, and whenever a RoundTask arrives the selected devices train together, clip and noise their updates as the task says, and run the secure aggregation stages. Private state never leaves --state-dir. Reconnects with exponential backoff and full jitter. Ctrl-C stops.
    """
    import logging

    from edge_client.app import ClientConfig, run_client
    from edge_client.faults import DROP_STAGES, FaultPlan
    from edge_client.transport_policy import token_in_clear, token_transport_refusal
    from fedmask.console import log_handler

    refusal = token_transport_refusal(coordinator, has_token=token is not None, has_tls_ca=tls_ca is not None,
                                      allow_insecure=insecure_token_without_tls)
    if refusal is not None:
        raise typer.BadParameter(refusal, param_hint="--token")

    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        raise typer.BadParameter(f"unknown level {log_level!r}", param_hint="--log-level")
    logging.basicConfig(
        level=level, format="%(message)s", datefmt="%H:%M:%S",
        handlers=[log_handler()], force=True,
    )
    logging.getLogger("grpc").setLevel(max(level, logging.WARNING))
    if token_in_clear(coordinator, has_token=token is not None, has_tls_ca=tls_ca is not None):
        logging.getLogger("edge_client").warning(
            "--insecure-token-without-tls: the bearer token goes to %s over the network in clear", coordinator)
    if drop_stage is not None and drop_stage not in DROP_STAGES:
        raise typer.BadParameter(f"unknown stage {drop_stage!r}; one of {_STAGES}", param_hint="--drop-stage")
    if drop_rate > 0 and drop_stage is None:
        raise typer.BadParameter("--drop-rate needs --drop-stage", param_hint="--drop-stage")
    if crash_after_round is not None and crash_after_round < 0:
        raise typer.BadParameter("must be >= 0", param_hint="--crash-after-round")
    from edge_client.cohort_floor import CohortFloor
    from edge_client.platform_trainer import PlatformHosting

    if (users is None) == (platform is None):
        raise typer.BadParameter("give exactly one of --users (devices = users) and --platform (one platform device)",
                                 param_hint="--users / --platform")
    hosting = None
    if platform is not None:
        try:
            hosting = PlatformHosting(platform=platform, n_platforms=platforms, beta=dirichlet_beta)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--platform") from None
    if min_cohort is None:
        min_cohort = hosting.n_platforms if hosting is not None else 3
    try:
        floor = CohortFloor(min_cohort=min_cohort, min_threshold=min_threshold)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    faults = FaultPlan(drop_rate=drop_rate, drop_stage=drop_stage, seed=seed,
                       crash_after_round=crash_after_round, delay_ms=delay_ms,
                       garbage_metrics=fault_garbage_metrics, garbage_shares=fault_garbage_shares)
    config = ClientConfig(
        coordinator=coordinator, users=users or "", state_dir=state_dir, dataset=dataset,
        data_dir=str(data_dir) if data_dir is not None else None, device=device, seed=seed, name=name,
        tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key, tls_server_name=tls_server_name, token=token,
        faults=faults, exit_after_rounds=exit_after_rounds, threads=threads,
        debug_record_inputs=debug_record_inputs, allow_insecure_plaintext=debug_allow_insecure_plaintext,
        cohort_floor=floor, serve_recommendations=serve_recommendations, device_ca=device_ca, platform=hosting,
        unprotected_plaintext_j_bound=unprotected_plaintext_j_bound,
    )
    code = run_client(config)
    if code:
        raise typer.Exit(code)
