"""`fedmask coordinator`: run the gRPC coordinator.

Every flag overrides the matching setting of coordinator.settings (flags >
FEDMASK_* environment > TOML file > defaults); a flag that is not given
leaves the setting to the lower sources.
"""

from __future__ import annotations

import json
from pathlib import Path
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:  # the coordinator package is imported lazily (the CLI's start-up time)
    from coordinator.settings import CoordinatorSettings

_GRAPH_HELP = "SecAgg graph: 'full' (Bonawitz), 'auto' (SecAgg+ sized by secagg) or K neighbours per device."
_THRESHOLD_HELP = "Shamir threshold policy: 'majority', 'two_thirds' or a fraction in (0.5, 1] of each group."


def _graph(value: str | None) -> Any:
    if value is None:
        return None
    return int(value) if value.isdigit() else value


def _threshold(value: str | None) -> Any:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return value


def _json_object(value: str | None, flag: str) -> dict | None:
    if value is None:
        return None
    try:
        out = json.loads(value)
    except ValueError as exc:
        raise typer.BadParameter(f"{flag} must be a JSON object: {exc}") from None
    if not isinstance(out, dict):
        raise typer.BadParameter(f"{flag} must be a JSON object")
    return out


# Which setting (coordinator.settings, dotted) each flag of `fedmask coordinator` overrides.
# Every parameter of the command is here but config and log_level, which it reads itself.
_SETTING_OF_FLAG: dict[str, str] = {
    "listen": "listen_address",
    "database_url": "database_url",
    "rounds": "rounds",
    "round_metrics": "round_metrics",
    "seed": "seed",
    "heartbeat_interval": "heartbeat_interval",
    "max_message_bytes": "max_receive_message_bytes",
    "health_listen": "health_listen_address",
    "database_wait": "database_wait_s",
    "model": "model.name",
    "model_params": "model.hyperparameters",
    "cohort_size": "cohort.size",
    "cohort_minimum": "cohort.minimum",
    "over_selection": "cohort.over_selection",
    "allow_consecutive": "cohort.allow_consecutive",
    "round_pause": "cohort.pause",
    "selection_deadline": "deadlines.selection",
    "deadline_policy": "deadlines.policy",
    "deadline_floor": "deadlines.floor",
    "training_deadline": "deadlines.training",
    "advertise_keys_deadline": "deadlines.advertise_keys",
    "share_keys_deadline": "deadlines.share_keys",
    "share_check_deadline": "deadlines.share_check",
    "masked_input_deadline": "deadlines.masked_input",
    "consistency_check_deadline": "deadlines.consistency_check",
    "unmasking_deadline": "deadlines.unmasking",
    "secagg_graph": "secagg.graph",
    "secagg_threshold": "secagg.threshold",
    "modulus_bits": "secagg.modulus_bits",
    "secagg_clip": "secagg.clip",
    "expected_dropout": "secagg.expected_dropout",
    "group_size": "secagg.group_size",
    "signatures": "secagg.signatures",
    "consistency_check": "secagg.consistency_check",
    "device_ca": "secagg.device_ca",
    "dp_mode": "dp.mode",
    "dp_mechanism": "dp.mechanism",
    "dp_clip": "dp.clip",
    "dp_noise": "dp.noise_multiplier",
    "dp_delta": "dp.delta",
    "dp_accountant": "dp.accountant",
    "dp_dropouts": "dp.dropouts",
    "tls_cert": "tls.cert",
    "tls_key": "tls.key",
    "tls_client_ca": "tls.client_ca",
    "require_client_cert": "tls.require_client_cert",
    "auth": "auth.mode",
    "insecure_token_without_tls": "auth.allow_insecure_token",
    "token_file": "auth.token_file",
    "dp_epsilon_budget": "dp.epsilon_budget",
    "admin_listen": "admin.listen",
    "admin_auth": "admin.auth",
    "admin_token_file": "admin.token_file",
    "metrics_listen": "metrics.listen",
    "replica_id": "replica.id",
    "lease_seconds": "replica.lease_s",
    "replica_mode": "replica.mode",
    "advertise_admin": "replica.advertise_admin",
    "hello_timeout": "limits.hello_timeout_s",
    "max_streams": "limits.max_streams",
    "max_streams_per_peer": "limits.max_streams_per_peer",
    "session_rate": "limits.session_rate",
    "enroll_rate": "limits.enroll_rate",
    "message_rate": "limits.message_rate",
    "max_announced_devices": "limits.max_announced_devices",
    "debug_record_sums": "debug.record_sums",
    "debug_insecure_plaintext": "debug.insecure_plaintext",
    "unprotected_plaintext_j_bound": "hybrid.unprotected_plaintext_j_bound",
}
_NOT_SETTINGS = ("config", "log_level")
# The flags whose text becomes another value in the settings.
_CONVERT: dict[str, Callable[[Any], Any]] = {
    "model_params": lambda value: _json_object(value, "--model-params"),
    "secagg_graph": _graph,
    "secagg_threshold": _threshold,
}


def settings_overrides(flags: Mapping[str, Any]) -> dict[str, Any]:
    """{setting key: value} for the command's flags (parameter name -> value), converted where the
    setting needs it; a flag not given is None, which leaves its setting to the lower sources. A
    parameter that is neither in _SETTING_OF_FLAG nor in _NOT_SETTINGS is a programming error (KeyError)."""
    unknown = set(flags) - set(_SETTING_OF_FLAG) - set(_NOT_SETTINGS)
    if unknown:
        raise KeyError(f"coordinator flags without a setting: {sorted(unknown)}")
    return {key: _CONVERT.get(flag, _same)(flags[flag]) for flag, key in _SETTING_OF_FLAG.items()}


def _same(value: Any) -> Any:
    return value


def coordinator(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML settings file (else $FEDMASK_CONFIG).")] = None,
    listen: Annotated[str | None, typer.Option(help="gRPC listen address HOST:PORT (default 127.0.0.1:50051).", rich_help_panel="Service")] = None,
    database_url: Annotated[str | None, typer.Option(help="Store: sqlite:///FILE (default ./fedmask.db), postgresql+psycopg://..., or memory://.", rich_help_panel="Service")] = None,
    rounds: Annotated[int | None, typer.Option(min=1, help="Stop after this many rounds (default: run until stopped).", rich_help_panel="Service")] = None,
    round_metrics: Annotated[bool | None, typer.Option("--round-metrics/--no-round-metrics", help="Ask devices for round metrics, learnt only as totals through the secure sum and not covered by DP (default on); off: no metric leaves a device.", rich_help_panel="Service")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of cohort selection and of the initial model (default: OS entropy / 0).", rich_help_panel="Service")] = None,
    heartbeat_interval: Annotated[float | None, typer.Option(help="Seconds between client heartbeats; 3 silent intervals close a session (default 10).", rich_help_panel="Service")] = None,
    max_message_bytes: Annotated[int | None, typer.Option(help="gRPC max receive message size (default: sized from the model and cohort).", rich_help_panel="Service")] = None,
    health_listen: Annotated[str | None, typer.Option(help="Also serve grpc.health.v1 alone, in plaintext, on HOST:PORT (container and Kubernetes probes; default: off).", rich_help_panel="Service")] = None,
    database_wait: Annotated[float | None, typer.Option(min=0, help="Seconds to keep retrying an unreachable database server at start, with backoff (default 60; 0: fail at once).", rich_help_panel="Service")] = None,
    log_level: Annotated[str, typer.Option(help="Logging level: DEBUG, INFO, WARNING, ERROR.", rich_help_panel="Service")] = "INFO",
    model: Annotated[str | None, typer.Option(help="Model: fedrap, fedmmf, fedmf, pfedrec, or 'synthetic' (benchmarks; needs vector_length).", rich_help_panel="Model")] = None,
    model_params: Annotated[str | None, typer.Option(help='Model hyperparameters as JSON, e.g. \'{"n_users": 943, "n_items": 1682, "k": 32}\' or \'{"vector_length": 53824}\' for synthetic.', rich_help_panel="Model")] = None,
    cohort_size: Annotated[int | None, typer.Option(help="Devices per round before over-selection (default 100).", rich_help_panel="Cohort")] = None,
    cohort_minimum: Annotated[int | None, typer.Option(help="A round starts only with at least this many eligible devices (default 10).", rich_help_panel="Cohort")] = None,
    over_selection: Annotated[float | None, typer.Option(help="Extra fraction selected to absorb dropouts: ceil(size*(1+f)) (default 0.3).", rich_help_panel="Cohort")] = None,
    allow_consecutive: Annotated[bool | None, typer.Option("--allow-consecutive/--no-consecutive", help="Let a device contribute to two consecutive rounds (default: no; consecutive uploads reveal its gradient).", rich_help_panel="Cohort")] = None,
    round_pause: Annotated[float | None, typer.Option(help="Seconds to wait between rounds (default 0).", rich_help_panel="Cohort")] = None,
    selection_deadline: Annotated[float | None, typer.Option(help="Seconds to wait for a full cohort once the minimum is available (default 60).", rich_help_panel="Deadlines")] = None,
    deadline_policy: Annotated[str | None, typer.Option(help="adaptive (default): each stage's deadline is learnt from what honest devices took in recent rounds (margin x high quantile + slack), between --deadline-floor and the stage's deadline below, which is also where it starts; fixed: the stage deadlines below as they are.", rich_help_panel="Deadlines")] = None,
    deadline_floor: Annotated[float | None, typer.Option(help="Adaptive policy: no learnt deadline goes below this many seconds (default 1.0).", rich_help_panel="Deadlines")] = None,
    training_deadline: Annotated[float | None, typer.Option(help="Seconds for local training before AdvertiseKeys (default 300; with the adaptive policy, ceilings).", rich_help_panel="Deadlines")] = None,
    advertise_keys_deadline: Annotated[float | None, typer.Option(help="Seconds for AdvertiseKeys, after training (default 30).", rich_help_panel="Deadlines")] = None,
    share_keys_deadline: Annotated[float | None, typer.Option(help="Seconds for ShareKeys (default 30).", rich_help_panel="Deadlines")] = None,
    share_check_deadline: Annotated[float | None, typer.Option(help="Seconds for the share check: devices open the relayed shares and report failures (default 30).", rich_help_panel="Deadlines")] = None,
    masked_input_deadline: Annotated[float | None, typer.Option(help="Seconds for MaskedInput (default 300).", rich_help_panel="Deadlines")] = None,
    consistency_check_deadline: Annotated[float | None, typer.Option(help="Seconds for ConsistencyCheck (active mode; default 30).", rich_help_panel="Deadlines")] = None,
    unmasking_deadline: Annotated[float | None, typer.Option(help="Seconds for Unmasking (default 60).", rich_help_panel="Deadlines")] = None,
    secagg_graph: Annotated[str | None, typer.Option(help=_GRAPH_HELP + " (default auto)", rich_help_panel="Secure aggregation")] = None,
    secagg_threshold: Annotated[str | None, typer.Option(help=_THRESHOLD_HELP + " (default two_thirds; 'auto' graphs use secagg's t)", rich_help_panel="Secure aggregation")] = None,
    modulus_bits: Annotated[int | None, typer.Option(help="Arithmetic modulo 2^bits, 8..32 (default 32).", rich_help_panel="Secure aggregation")] = None,
    secagg_clip: Annotated[float | None, typer.Option(help="Per-coordinate clip of the fixed-point encoding (default 1.0).", rich_help_panel="Secure aggregation")] = None,
    expected_dropout: Annotated[float | None, typer.Option(help="Dropout rate the sparse graph is sized for (default 0.1).", rich_help_panel="Secure aggregation")] = None,
    group_size: Annotated[int | None, typer.Option(help="Secure aggregation in groups (D99): a selected cohort of 2G devices or more runs as groups of at least G, each its own SecAgg(+) instance, their sums added; the coordinator learns each group's sum. A client stream's devices stay in one group. 0: always one instance (default 500).", rich_help_panel="Secure aggregation")] = None,
    signatures: Annotated[bool | None, typer.Option("--signatures/--no-signatures", help="Active-adversary mode: Ed25519-signed keys and the consistency check.", rich_help_panel="Secure aggregation")] = None,
    consistency_check: Annotated[bool | None, typer.Option("--consistency-check/--no-consistency-check", help="Run the consistency-check stage (needs --signatures).", rich_help_panel="Secure aggregation")] = None,
    device_ca: Annotated[Path | None, typer.Option(help="The device CA certificate (PEM; never its key; needs --signatures): a device whose advertised keys come without an identity certificate of this CA for its key and id is dropped from the round, so its peers never see it.", rich_help_panel="Secure aggregation", show_default=False)] = None,
    dp_mode: Annotated[str | None, typer.Option(help="Differential privacy: none, local (each device adds full noise), distributed (default local).", rich_help_panel="Differential privacy")] = None,
    dp_mechanism: Annotated[str | None, typer.Option(help="The noise (D88): discrete-gaussian (default: integer noise sampled exactly on the device, inside the secure sum's field, epsilon from its own bound, no metric totals) or gaussian-float (the earlier float path; its epsilon is APPROXIMATE, a warning says so).", rich_help_panel="Differential privacy")] = None,
    dp_clip: Annotated[float | None, typer.Option(help="L2 clipping norm tau of an update (default 0.1).", rich_help_panel="Differential privacy")] = None,
    dp_noise: Annotated[float | None, typer.Option(help="Noise multiplier z: std = z * tau (default 1.0).", rich_help_panel="Differential privacy")] = None,
    dp_delta: Annotated[float | None, typer.Option(help="Delta of the (epsilon, delta) accounting (default 1e-5).", rich_help_panel="Differential privacy")] = None,
    dp_accountant: Annotated[str | None, typer.Option(help="Accountant: rdp or pld (default rdp; pld only with gaussian-float).", rich_help_panel="Differential privacy")] = None,
    dp_dropouts: Annotated[str | None, typer.Option(help="What dropped devices' noise does (dp-mode distributed): account (default, D19: the shares they take away are priced) or remove (Dordis's way, D110: every device adds the noise of the worst tolerated dropout in seeded components and the survivors' surplus is removed at unmasking; needs the discrete Gaussian, --secagg-graph full and no groups; slow: see docs/privacy.md).", rich_help_panel="Differential privacy")] = None,
    tls_cert: Annotated[Path | None, typer.Option(help="Server certificate chain (PEM).", rich_help_panel="Security")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="Server private key (PEM).", rich_help_panel="Security")] = None,
    tls_client_ca: Annotated[Path | None, typer.Option(help="CA bundle client certificates must chain to.", rich_help_panel="Security")] = None,
    require_client_cert: Annotated[bool | None, typer.Option("--require-client-cert/--no-require-client-cert", help="Require client certificates (mTLS).", rich_help_panel="Security")] = None,
    auth: Annotated[str | None, typer.Option(help="Authentication: mtls, token (FEDMASK_AUTH__TOKEN), or none (loopback only; default).", rich_help_panel="Security")] = None,
    token_file: Annotated[Path | None, typer.Option(help="With --auth token: a file of accepted bearer tokens, one per line, re-read when it changes (rotate tokens without a restart: add the new one, move the clients, remove the old one).", rich_help_panel="Security")] = None,
    insecure_token_without_tls: Annotated[bool | None, typer.Option("--insecure-token-without-tls", help="INSECURE: allow --auth token without TLS on a non-loopback --listen address; the bearer token then crosses the network in clear (logged as a WARNING at start). Refused without this flag.", rich_help_panel="Security")] = None,
    dp_epsilon_budget: Annotated[float | None, typer.Option("--epsilon-budget", min=0.0, help="Total epsilon (at --dp-delta) the federation may spend: a round whose epsilon after it could exceed this is never opened; the federation then reports 'budget exhausted' (also after a restart: the ledger is in the store). Default: no budget.", rich_help_panel="Differential privacy")] = None,
    admin_listen: Annotated[str | None, typer.Option(help="HOST:PORT of the admin gRPC listener (fedmask.v1.CoordinatorAdmin: live state, events, pause/resume/abort/rollback, top-k relay), a port of its own so devices can be kept away from it. Default: no admin listener.", rich_help_panel="Admin")] = None,
    admin_auth: Annotated[str | None, typer.Option(help="Admin credential: token (default; the token from $FEDMASK_ADMIN__TOKEN, --admin-token-file or $FEDMASK_ADMIN__TOKEN_SHA256, never a flag), mtls (a client certificate with the admin role, `fedmask certs issue-admin`, over --tls-*), or none (loopback only).", rich_help_panel="Admin")] = None,
    admin_token_file: Annotated[Path | None, typer.Option(help="A file of accepted admin tokens, one per line, re-read when it changes (rotate without a restart); the coordinator keeps only their SHA-256.", rich_help_panel="Admin")] = None,
    metrics_listen: Annotated[str | None, typer.Option(help="HOST:PORT of the Prometheus endpoint (GET /metrics). Default: off.", rich_help_panel="Admin")] = None,
    replica_id: Annotated[str | None, typer.Option(help="This replica's name in the leader lease and the logs (default HOSTNAME-PID). Replicas of one tier share a PostgreSQL store; one leads (D90), the others wait as standbys and take over when its lease expires.", rich_help_panel="Replicas")] = None,
    lease_seconds: Annotated[float | None, typer.Option(min=1.0, max=600.0, help="Seconds the leader's lease lasts; it is renewed every third of it, and a dead leader is replaced within about this long (default 10). On SQLite, a second coordinator waits 1.5 leases for the lease, then exits with code 2.", rich_help_panel="Replicas")] = None,
    replica_mode: Annotated[str | None, typer.Option(help="standby (default): one replica leads and serves devices, the others wait (D90). active: every replica holds device streams and runs its devices' groups, one plans the rounds (D109); needs PostgreSQL.", rich_help_panel="Replicas")] = None,
    advertise_admin: Annotated[str | None, typer.Option(help="HOST:PORT at which the admin service reaches this replica's admin listener (active replicas, D109): it sends there the top-k requests of the devices this replica holds (D111). Default: not advertised, and those requests go to the admin service's own coordinator address.", rich_help_panel="Replicas")] = None,
    hello_timeout: Annotated[float | None, typer.Option(min=0.001, help="Seconds a new Session stream has to send its Hello before it is ended with DEADLINE_EXCEEDED (default 10).", rich_help_panel="Limits")] = None,
    max_streams: Annotated[int | None, typer.Option(min=1, help="Concurrent Session streams, with or without Hello; more are refused with RESOURCE_EXHAUSTED (default 1024).", rich_help_panel="Limits")] = None,
    max_streams_per_peer: Annotated[int | None, typer.Option(min=1, help="Concurrent Session streams of one peer: its certificate name in mTLS mode, else its host (default 256; raise it when many clients share a NAT).", rich_help_panel="Limits")] = None,
    session_rate: Annotated[float | None, typer.Option(min=0.001, help="New Session streams per second per peer, after a burst of limits.session_burst (default 5/s, burst 50).", rich_help_panel="Limits")] = None,
    enroll_rate: Annotated[float | None, typer.Option(min=0.001, help="Enroll calls per second per peer, after a burst of limits.enroll_burst (default 2/s, burst 20).", rich_help_panel="Limits")] = None,
    message_rate: Annotated[float | None, typer.Option(min=0.001, help="Heartbeat / CheckIn messages per second per stream, after a burst of limits.message_burst (default 5/s, burst 50).", rich_help_panel="Limits")] = None,
    max_announced_devices: Annotated[int | None, typer.Option(min=1, max=100_000, help="Devices one Hello or CheckIn may announce (default 10000).", rich_help_panel="Limits")] = None,
    debug_record_sums: Annotated[bool | None, typer.Option("--debug-record-sums/--no-debug-record-sums", help="DEBUG ONLY (loopback only): store each round's decoded sum digest in its metrics.", rich_help_panel="Debug")] = None,
    unprotected_plaintext_j_bound: Annotated[float | None, typer.Option("--unprotected-plaintext-j-bound", help="UNPROTECTED UPDATES (FedMMF hybrid rounds, docs/decisions.md D64; setting hybrid.unprotected_plaintext_j_bound): a device whose privacy indicator J is at most this (and at most its client's own cap) sends its update in PLAINTEXT, the others through secure aggregation; the coordinator learns the plaintext updates. Needs TLS and model fedmmf. Default: off.", rich_help_panel="Security", show_default=False)] = None,
    debug_insecure_plaintext: Annotated[bool | None, typer.Option("--debug-insecure-plaintext/--no-debug-insecure-plaintext", help="INSECURE, benchmarks only (loopback only): rounds WITHOUT secure aggregation; devices send unmasked updates (clients must opt in with --debug-allow-insecure-plaintext).", rich_help_panel="Debug")] = None,
) -> None:
    """Run the coordinator: enrolment, session streams, cohort selection and secure-aggregation rounds.

    Ctrl-C / SIGTERM stops it gracefully (running round aborted with COORDINATOR_SHUTDOWN, clients told, store closed).

    The bearer token is read from FEDMASK_AUTH__TOKEN or the TOML file only, never from a flag (flags show up in process listings).

    Limits on what a peer can make the coordinator do are under "Limits" (all of them, bursts and store look-ups included, in the \\[limits] table of the TOML file or FEDMASK_LIMITS__*).
    """
    flags = dict(locals())  # the parameters, and nothing else yet: settings_overrides reads them by name
    from coordinator.logs import configure_logging
    from coordinator.settings import CoordinatorSettings, SettingsError

    overrides = settings_overrides(flags)
    configure_logging(log_level)
    try:
        settings = CoordinatorSettings.load(config_file=config, overrides=overrides)
    except SettingsError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(_serve(settings))


#: Seconds a deposed leader's shutdown may take before the process ends
#: anyway (coordinator.server.exit_if_stuck; a normal one takes well under).
DEPOSED_EXIT_S = 45.0


def _serve(settings: CoordinatorSettings) -> int:
    """Serve until stopped; the exit code. A start-up failure exits with code 1, a second Ctrl-C with 130."""
    import asyncio

    from coordinator.active_serve import serve_active
    from coordinator.model_host import ModelConfigError
    from coordinator.server import serve
    from coordinator.store import StoreError

    run = serve_active if settings.replica.mode == "active" else serve  # D109 / D90
    try:
        return asyncio.run(run(settings, deposed_exit_s=DEPOSED_EXIT_S))
    except (ModelConfigError, StoreError, ValueError, OSError) as exc:
        typer.echo(f"fedmask coordinator: {exc}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:  # a second Ctrl-C during shutdown
        raise typer.Exit(130) from None


def register(app: typer.Typer) -> None:
    """Attach `fedmask coordinator` to the root app."""
    app.command("coordinator", no_args_is_help=False)(coordinator)
