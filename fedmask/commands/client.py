"""`fedmask client`: an edge-client process hosting one or many devices (edge_client/).
Its options are in fedmask/commands/client_options.py."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from fedmask.commands.client_options import (
    STAGES,
    CoordinatorOption,
    CrashAfterRoundOption,
    DatasetOption,
    DebugAllowInsecurePlaintextOption,
    DebugRecordInputsOption,
    DelayMsOption,
    DeviceCaOption,
    DeviceOption,
    DirichletBetaOption,
    DropRateOption,
    DropStageOption,
    ExitAfterRoundsOption,
    FaultFalseReportsAboutOption,
    FaultFalseReportsOption,
    FaultForgedMetricOption,
    FaultGarbageMetricsOption,
    FaultGarbageSharesOption,
    InsecureTokenWithoutTlsOption,
    LogLevelOption,
    MaxDpClipOption,
    MaxRoundsPerHourOption,
    MaxTopKOption,
    MinCohortOption,
    MinDpOption,
    MinNoiseMultiplierOption,
    MinThresholdOption,
    NameOption,
    NoDpFloorOption,
    PlatformOption,
    PlatformsOption,
    RecommendSeenItemsOption,
    SeedOption,
    ServeRecommendationsOption,
    StateDirOption,
    ThreadsOption,
    TlsCaOption,
    TlsCertOption,
    TlsKeyOption,
    TlsServerNameOption,
    TokenOption,
    UnprotectedPlaintextJBoundOption,
    UsersOption,
)
from fedmask.commands.dataset_options import DataDirOption

if TYPE_CHECKING:  # edge_client is imported lazily (the CLI's start-up time)
    from edge_client.cohort_floor import CohortFloor
    from edge_client.dp_floor import DpFloor
    from edge_client.faults import FaultPlan
    from edge_client.platform_trainer import PlatformHosting


def register(app: typer.Typer) -> None:
    """Attach `fedmask client` to the root app."""
    app.command("client")(client)


def client(
    coordinator: CoordinatorOption,
    state_dir: StateDirOption,
    users: UsersOption = None,
    dataset: DatasetOption = "ml-100k",
    data_dir: DataDirOption = None,
    device: DeviceOption = "cpu",
    seed: SeedOption = 0,
    name: NameOption = None,
    tls_ca: TlsCaOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_server_name: TlsServerNameOption = None,
    token: TokenOption = None,
    insecure_token_without_tls: InsecureTokenWithoutTlsOption = False,
    drop_rate: DropRateOption = 0.0,
    drop_stage: DropStageOption = None,
    fault_garbage_metrics: FaultGarbageMetricsOption = False,
    fault_forged_metric: FaultForgedMetricOption = None,
    fault_garbage_shares: FaultGarbageSharesOption = False,
    fault_false_reports: FaultFalseReportsOption = False,
    fault_false_reports_about: FaultFalseReportsAboutOption = None,
    crash_after_round: CrashAfterRoundOption = None,
    delay_ms: DelayMsOption = 0.0,
    exit_after_rounds: ExitAfterRoundsOption = None,
    threads: ThreadsOption = None,
    min_cohort: MinCohortOption = None,
    platform: PlatformOption = None,
    platforms: PlatformsOption = 5,
    dirichlet_beta: DirichletBetaOption = 1.0,
    min_threshold: MinThresholdOption = 0.5,
    min_dp: MinDpOption = "distributed",
    min_noise_multiplier: MinNoiseMultiplierOption = 1.0,
    max_dp_clip: MaxDpClipOption = None,
    no_dp_floor: NoDpFloorOption = False,
    max_rounds_per_hour: MaxRoundsPerHourOption = 600,
    serve_recommendations: ServeRecommendationsOption = True,
    max_top_k: MaxTopKOption = 100,
    recommend_seen_items: RecommendSeenItemsOption = False,
    device_ca: DeviceCaOption = None,
    unprotected_plaintext_j_bound: UnprotectedPlaintextJBoundOption = None,
    log_level: LogLevelOption = "info",
    debug_record_inputs: DebugRecordInputsOption = False,
    debug_allow_insecure_plaintext: DebugAllowInsecurePlaintextOption = False,
) -> None:
    """Host devices of a dataset, enrol them, and train with the coordinator.

    One process hosts one device per selected user. The devices are enrolled once (the result is kept in --state-dir), one Session stream is opened, and whenever a RoundTask arrives the selected devices train together, clip and noise their updates as the task says, and run the secure aggregation stages. Private state never leaves --state-dir. Reconnects with exponential backoff and full jitter. Ctrl-C stops.
    """
    from edge_client.app import ClientConfig, run_client
    from edge_client.contributions import ContributionRule
    from edge_client.recommend_policy import RecommendationPolicy

    _configure_logging(log_level, coordinator, token=token, tls_ca=tls_ca, allow_insecure=insecure_token_without_tls)
    faults = _fault_plan(drop_rate=drop_rate, drop_stage=drop_stage, seed=seed, crash_after_round=crash_after_round,
                         delay_ms=delay_ms, garbage_metrics=fault_garbage_metrics, garbage_shares=fault_garbage_shares,
                         false_reports=fault_false_reports, false_reports_about=fault_false_reports_about,
                         forged_metrics=fault_forged_metric or [])
    hosting = _platform_hosting(users, platform, platforms, dirichlet_beta)
    floor = _cohort_floor(min_cohort, min_threshold, hosting)
    dp_floor = _dp_floor(min_dp, min_noise_multiplier, max_dp_clip, off=no_dp_floor)
    config = ClientConfig(
        coordinator=coordinator, users=users or "", state_dir=state_dir, dataset=dataset,
        data_dir=str(data_dir) if data_dir is not None else None, device=device, seed=seed, name=name,
        tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key, tls_server_name=tls_server_name, token=token,
        faults=faults, exit_after_rounds=exit_after_rounds, threads=threads,
        debug_record_inputs=debug_record_inputs, allow_insecure_plaintext=debug_allow_insecure_plaintext,
        cohort_floor=floor, dp_floor=dp_floor, contribution_rule=ContributionRule(max_rounds=max_rounds_per_hour),
        device_ca=device_ca, platform=hosting,
        unprotected_plaintext_j_bound=unprotected_plaintext_j_bound,
        recommendations=RecommendationPolicy(serve=serve_recommendations, max_k=max_top_k,
                                             share_seen=recommend_seen_items),
    )
    code = run_client(config)
    if code:
        raise typer.Exit(code)


def _configure_logging(log_level: str, coordinator: str, *, token: str | None, tls_ca: Path | None,
                       allow_insecure: bool) -> None:
    """Refuse a bearer token that would cross the network in clear (unless allowed), then log to stderr
    at `log_level`, warning once when the token does go in clear."""
    import logging

    from edge_client.transport_policy import token_in_clear, token_transport_refusal
    from fedmask.console import log_handler

    refusal = token_transport_refusal(coordinator, has_token=token is not None, has_tls_ca=tls_ca is not None,
                                      allow_insecure=allow_insecure)
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


def _fault_plan(*, drop_rate: float, drop_stage: str | None, seed: int, crash_after_round: int | None,
                delay_ms: float, garbage_metrics: bool, garbage_shares: bool, forged_metrics: list[str],
                false_reports: bool = False, false_reports_about: str | None = None) -> FaultPlan:
    """The fault-injection options, checked (typer.BadParameter naming the option)."""
    from edge_client.faults import DROP_STAGES, FaultPlan

    if drop_stage is not None and drop_stage not in DROP_STAGES:
        raise typer.BadParameter(f"unknown stage {drop_stage!r}; one of {STAGES}", param_hint="--drop-stage")
    if drop_rate > 0 and drop_stage is None:
        raise typer.BadParameter("--drop-rate needs --drop-stage", param_hint="--drop-stage")
    if crash_after_round is not None and crash_after_round < 0:
        raise typer.BadParameter("must be >= 0", param_hint="--crash-after-round")
    forged: list[tuple[str, float]] = []
    for item in forged_metrics:
        name, sep, value = item.partition("=")
        try:
            forged.append((name, float(value)))
        except ValueError:
            raise typer.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--fault-forged-metric") from None
        if not sep:
            raise typer.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--fault-forged-metric")
    try:
        about = frozenset(int(x) for x in (false_reports_about or "").split(",") if x.strip())
    except ValueError:
        raise typer.BadParameter("not a comma-separated list of device ids",
                                 param_hint="--fault-false-reports-about") from None
    try:
        return FaultPlan(drop_rate=drop_rate, drop_stage=drop_stage, seed=seed, crash_after_round=crash_after_round,
                         delay_ms=delay_ms, garbage_metrics=garbage_metrics, garbage_shares=garbage_shares,
                         forged_metrics=tuple(forged), false_reports=false_reports, false_reports_about=about)
    except ValueError as exc:  # the message names the option
        raise typer.BadParameter(str(exc)) from None


def _platform_hosting(users: str | None, platform: int | None, platforms: int, beta: float) -> PlatformHosting | None:
    """The platform this process hosts (--platform), None when it hosts --users; exactly one is given."""
    from edge_client.platform_trainer import PlatformHosting

    if (users is None) == (platform is None):
        raise typer.BadParameter("give exactly one of --users (devices = users) and --platform (one platform device)",
                                 param_hint="--users / --platform")
    if platform is None:
        return None
    try:
        return PlatformHosting(platform=platform, n_platforms=platforms, beta=beta)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--platform") from None


def _cohort_floor(min_cohort: int | None, min_threshold: float, hosting: PlatformHosting | None) -> CohortFloor:
    """The smallest round the devices take part in; --min-cohort defaults to every platform with --platform,
    else 3."""
    from edge_client.cohort_floor import CohortFloor

    if min_cohort is None:
        min_cohort = hosting.n_platforms if hosting is not None else 3
    try:
        return CohortFloor(min_cohort=min_cohort, min_threshold=min_threshold)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


def _dp_floor(min_dp: str, min_noise_multiplier: float, max_dp_clip: float | None, *, off: bool) -> DpFloor:
    """The least DP the devices train under (D85); --no-dp-floor: none, with a warning."""
    import logging

    from edge_client.dp_floor import DpFloor

    if off:
        logging.getLogger("edge_client").warning(
            "--no-dp-floor: the devices accept any DP setting, DP off included; a coordinator can difference two "
            "rounds and read one device's update (tests and benchmarks only)")
        return DpFloor.off()
    try:
        return DpFloor(min_mechanism=min_dp, min_noise_multiplier=min_noise_multiplier, max_clip=max_dp_clip)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
