"""Coordinator configuration: `CoordinatorSettings.load(...)`.

Sources, highest precedence first (nested groups are merged key by key),
read by the loader the admin service's settings use too (fedmask_settings):
  1. flags      `overrides` mapping, dotted keys ({"cohort.size": 50});
                None values mean "flag not given" and are dropped
  2. env        FEDMASK_<FIELD>, nested with "__": FEDMASK_COHORT__SIZE=50,
                FEDMASK_AUTH__TOKEN=..., dicts as JSON
                (FEDMASK_MODEL__HYPERPARAMETERS='{"lr": 0.05}')
  3. file       a TOML file: `config_file`, else $FEDMASK_CONFIG; top-level
                keys and [cohort], [deadlines], [secagg], [dp], [tls], [auth],
                [limits], [admin], [metrics], [replica], [debug], [hybrid], [model] /
                [model.hyperparameters] tables
  4. defaults   below

Every problem is reported at once as a `SettingsError` naming the dotted
field, its env variable, the message and the offending value (secrets
redacted). Unknown keys are errors (typos never pass silently). Relative
paths are resolved against the working directory.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    FilePath,
    PositiveFloat,
    PositiveInt,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import SettingsConfigDict

# SettingsError and unflatten are this module's too (callers import them from here).
from coordinator.replica_settings import ReplicaSettings, active_replica_refusal
from coordinator.store.url import check_database_url
from fedmask_settings import LayeredSettings, SettingsError, SettingsGroup, host_port_check, unflatten
from fedmask_settings import split_host_port as _split_host_port
from secagg.groups import DEFAULT_GROUP_SIZE
from wire.protocol import DEFAULT_MAX_TOP_K, MAX_TOP_K_LIMIT, is_loopback

ENV_PREFIX = "FEDMASK_"
CONFIG_ENV = "FEDMASK_CONFIG"
MIN_TOKEN_LENGTH = 16
#: A HOST:PORT the coordinator listens on (its errors call it a listen address).
ListenAddress = Annotated[str, host_port_check("listen address")]


class ModelSettings(SettingsGroup):
    #: Model to train ("fedrap", "fedmmf", "fedmf", "pfedrec", ...).
    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_\-]*$")] = "fedrap"
    #: Passed to the model as is (learning rate, embedding size, ...).
    hyperparameters: dict[str, Any] = Field(default_factory=dict)


class CohortSettings(SettingsGroup):
    #: Devices per round (n), before over-selection.
    size: PositiveInt = 100
    #: A round starts only with at least this many devices available.
    minimum: PositiveInt = 10
    #: Extra fraction selected to absorb dropouts: select ceil(size * (1 + f)).
    over_selection: Annotated[float, Field(ge=0.0, le=1.0)] = 0.3
    #: Let a device take part in two consecutive rounds. Off by default:
    #: consecutive uploads of one device reveal its gradient (FedRAP paper).
    allow_consecutive: bool = False
    #: Seconds to wait between the end of one round and the next selection.
    pause: Annotated[float, Field(ge=0.0)] = 0.0

    @model_validator(mode="after")
    def _minimum_fits(self) -> CohortSettings:
        if self.minimum > self.size:
            raise ValueError(f"cohort.minimum ({self.minimum}) must be <= cohort.size ({self.size})")
        return self

    @property
    def selected(self) -> int:
        return math.ceil(self.size * (1 + self.over_selection))


class DeadlineSettings(SettingsGroup):
    """Seconds each stage may take once the server opens it. With the
    adaptive policy (default) these are the ceilings and the starting
    values; each stage's deadline is learnt from what honest devices took
    in recent rounds (coordinator/round_policy.py, D21)."""

    #: adaptive: margin * quantile(recent honest completion times) + slack,
    #: within [floor, the stage's value]; fixed: the stage's value.
    policy: Literal["adaptive", "fixed"] = "adaptive"
    margin: Annotated[float, Field(ge=1.0, le=10.0)] = 1.5
    slack: Annotated[float, Field(ge=0.0)] = 0.25
    quantile: Annotated[float, Field(ge=0.5, le=1.0)] = 0.95
    #: Rounds of history per stage.
    window: Annotated[int, Field(ge=1, le=1000)] = 20
    #: No learnt deadline goes below this many seconds.
    floor: PositiveFloat = 1.0
    #: Seconds added to every stage's ceiling per device of the round's
    #: cohort: the server's work in a stage grows with the cohort, so a first
    #: round of 10,000 devices gets 50 s more per stage than the values below
    #: (which are sized for about 100).
    per_device: Annotated[float, Field(ge=0.0, le=1.0)] = 0.005

    selection: PositiveFloat = 60.0
    #: Local training, before a device advertises its keys: the stage-0
    #: window the server allows is training + advertise_keys.
    training: PositiveFloat = 300.0
    advertise_keys: PositiveFloat = 30.0
    share_keys: PositiveFloat = 30.0
    #: Devices open the relayed shares and report the ones that fail.
    share_check: PositiveFloat = 30.0
    #: Masking and upload (training happens before stage 0, see `training`).
    masked_input: PositiveFloat = 300.0
    consistency_check: PositiveFloat = 30.0
    unmasking: PositiveFloat = 60.0


#: "majority" = floor(n/2) + 1, "two_thirds" = ceil(2n/3), or a fraction in
#: (0.5, 1] of the group size (n = neighbours + 1, or the cohort when full).
ThresholdPolicy = Literal["majority", "two_thirds"] | Annotated[float, Field(gt=0.5, le=1.0)]


class SecaggSettings(SettingsGroup):
    #: "full" (Bonawitz), "auto" (sparse SecAgg+ graph sized by secagg for
    #: large cohorts), or a fixed number of neighbours per device.
    graph: Literal["full", "auto"] | Annotated[int, Field(ge=2)] = "auto"
    threshold: ThresholdPolicy = "two_thirds"
    #: Arithmetic modulo 2^modulus_bits; the wire packs uint32 words.
    modulus_bits: Annotated[int, Field(ge=8, le=32)] = 32
    #: Per-coordinate clipping range of the fixed-point encoding.
    clip: PositiveFloat = 1.0
    #: Active-adversary mode: identity signatures on advertised keys.
    signatures: bool = False
    #: Run the consistency-check stage (needs signatures).
    consistency_check: bool = False
    #: The device CA certificate (PEM; never its key), with signatures on:
    #: a device whose AdvertiseKeys carries no identity certificate of this
    #: CA for its enrolled key and id is dropped from the round as a
    #: protocol violation, so honest peers (which check the same against
    #: their own copy of the CA, D33) never see it and need not withdraw.
    device_ca: FilePath | None = None
    #: Secure aggregation in groups (D87, D99): a selected cohort of 2G
    #: devices or more runs as groups of at least G, each its own SecAgg(+)
    #: instance, their sums added; the server learns each group's sum. A
    #: client stream's devices stay in one group. 0: always one instance.
    group_size: Annotated[int, Field(ge=0)] = DEFAULT_GROUP_SIZE
    #: Dropout rate the sparse ("auto") graph is sized for.
    expected_dropout: Annotated[float, Field(ge=0.0, lt=0.5)] = 0.1
    #: Share-decryption reports (coordinator/peer_reports.py, D37): a device
    #: sits out `report_quarantine_rounds` rounds or `report_quarantine_s`
    #: seconds (whichever ends first) once `report_reporters` distinct client
    #: credentials, among reporters that stayed in their round past the share
    #: check, reported it in `report_rounds` distinct rounds within the last
    #: `report_window` rounds and `report_window_s` seconds. Each credential
    #: is charged for at most `report_quota` quarantines per `report_window_s`
    #: seconds. Quarantine never leaves fewer eligible devices than the
    #: cohort minimum. One report never reaches past its round.
    report_reporters: Annotated[int, Field(ge=2)] = 3
    report_rounds: Annotated[int, Field(ge=1)] = 2
    report_window: Annotated[int, Field(ge=1)] = 20
    report_window_s: PositiveFloat = 3600.0
    report_quarantine_rounds: Annotated[int, Field(ge=1)] = 10
    report_quarantine_s: PositiveFloat = 600.0
    report_quota: Annotated[int, Field(ge=1)] = 2

    @field_validator("graph")
    @classmethod
    def _even_degree(cls, value: object) -> object:
        if isinstance(value, int) and value % 2:
            raise ValueError(f"a sparse graph needs an even number of neighbours (Harary graph), got {value}")
        return value

    @model_validator(mode="after")
    def _consistency_needs_signatures(self) -> SecaggSettings:
        if self.group_size == 1:
            raise ValueError("secagg.group_size must be 0 (one instance) or at least 2")
        if self.consistency_check and not self.signatures:
            raise ValueError("secagg.consistency_check requires secagg.signatures = true")
        if self.report_window < self.report_rounds:
            raise ValueError("secagg.report_window must be at least secagg.report_rounds")
        if self.device_ca is not None and not self.signatures:
            raise ValueError("secagg.device_ca requires secagg.signatures = true (identity keys are checked there)")
        return self

    def threshold_for(self, group_size: int) -> int:
        """The Shamir threshold t for a group of `group_size` devices."""
        if group_size < 1:
            raise ValueError("group_size must be >= 1")
        if self.threshold == "majority":
            t = group_size // 2 + 1
        elif self.threshold == "two_thirds":
            t = math.ceil(2 * group_size / 3)
        else:
            t = math.ceil(float(self.threshold) * group_size)
        return min(max(t, 1), group_size)


class DpSettings(SettingsGroup):
    #: none: no clipping/noise; local: every device adds the full noise
    #: (FedRAP paper); distributed: noise split across the cohort.
    mode: Literal["none", "local", "distributed"] = "local"
    #: The noise (D88). discrete-gaussian: integer noise sampled exactly on
    #: the device, added in the secure sum's field (nothing clipped after
    #: the noise), epsilon from the mechanism's own zCDP bound; under it no
    #: metric totals are asked for (they would be outside epsilon, D36).
    #: gaussian-float: the earlier float path, kept for comparison; its
    #: epsilon is APPROXIMATE (float noise, rounded and clipped per
    #: coordinate by the fixed-point encoding) and the coordinator says so.
    mechanism: Literal["discrete-gaussian", "gaussian-float"] = "discrete-gaussian"
    #: L2 (Frobenius) clipping norm tau of an update.
    clip: PositiveFloat = 0.1
    #: Noise multiplier z (noise std = z * clip).
    noise_multiplier: Annotated[float, Field(ge=0.0)] = 1.0
    #: Target delta of the (epsilon, delta) accounting.
    delta: Annotated[float, Field(gt=0.0, lt=1.0)] = 1e-5
    #: dp_accounting accountant used for epsilon (models.privacy.epsilon).
    accountant: Literal["rdp", "pld"] = "rdp"
    #: Total epsilon (at `delta`) the federation may spend; None: no limit.
    #: The coordinator refuses to open a round whose epsilon after the round
    #: could exceed it (with distributed noise: if only the threshold of
    #: the cohort were counted) and reports the budget exhausted (D42).
    epsilon_budget: PositiveFloat | None = None
    #: Dropped devices' noise (distributed). account (D19): the shares they
    #: take away are priced. remove (Dordis's way, D110): devices add the
    #: worst tolerated dropout's noise in seeded components, the survivors'
    #: surplus is removed at unmasking (discrete Gaussian, full graph only;
    #: its cost is measured in docs/privacy.md).
    dropouts: Literal["account", "remove"] = "account"

    @model_validator(mode="after")
    def _budget_needs_noise(self) -> DpSettings:
        if self.epsilon_budget is not None and (self.mode == "none" or self.noise_multiplier == 0):
            raise ValueError("dp.epsilon_budget needs DP noise (dp.mode local or distributed, noise_multiplier > 0)")
        if self.mode != "none" and self.mechanism == "discrete-gaussian":
            if self.noise_multiplier == 0:
                raise ValueError("dp.mechanism 'discrete-gaussian' needs dp.noise_multiplier > 0 (no noise: dp.mode "
                                 "none)")
            if self.accountant == "pld":
                raise ValueError("dp.accountant 'pld' prices the continuous Gaussian's exact privacy loss; the "
                                 "discrete Gaussian's bound is zCDP, composed with dp.accountant 'rdp'")
        if self.dropouts == "remove" and not (self.mode == "distributed" and self.mechanism == "discrete-gaussian"):
            raise ValueError("dp.dropouts 'remove' needs dp.mode 'distributed' with dp.mechanism 'discrete-gaussian' "
                             "(the surplus is removed exactly only in the discrete Gaussian's integer field)")
        return self


class TlsSettings(SettingsGroup):
    #: Server certificate chain (PEM) and its private key.
    cert: FilePath | None = None
    key: FilePath | None = None
    #: CA bundle client certificates must chain to.
    client_ca: FilePath | None = None
    require_client_cert: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> TlsSettings:
        if (self.cert is None) != (self.key is None):
            raise ValueError("tls.cert and tls.key must be given together")
        if self.client_ca is not None and self.cert is None:
            raise ValueError("tls.client_ca needs tls.cert and tls.key (client auth needs TLS)")
        if self.require_client_cert and self.client_ca is None:
            raise ValueError("tls.require_client_cert needs tls.client_ca")
        return self

    @property
    def enabled(self) -> bool:
        return self.cert is not None


class AuthSettings(SettingsGroup):
    #: mtls: client certificates from the federation CA (needs tls.*);
    #: token: "authorization: Bearer <token>" metadata on every call;
    #: none: no authentication, allowed on a loopback address only.
    mode: Literal["mtls", "token", "none"] = "none"
    token: SecretStr | None = None
    #: Instead of `token`: a file of accepted tokens (one per line), re-read
    #: when it changes, so tokens rotate without a restart (D30).
    token_file: FilePath | None = None
    #: INSECURE. Token mode without TLS on a non-loopback listen_address
    #: sends the bearer token over the network in clear; it is refused
    #: unless this is true (flag --insecure-token-without-tls), and then
    #: logged as a WARNING at start.
    allow_insecure_token: bool = False

    @model_validator(mode="after")
    def _token_matches_mode(self) -> AuthSettings:
        if self.mode == "token":
            if self.token is not None and self.token_file is not None:
                raise ValueError("give auth.token or auth.token_file, not both")
            if self.token_file is None and (self.token is None or len(self.token.get_secret_value()) < MIN_TOKEN_LENGTH):
                raise ValueError(f"auth.mode 'token' needs auth.token of at least {MIN_TOKEN_LENGTH} characters "
                                 "or auth.token_file")
        elif self.token is not None or self.token_file is not None:
            which = "auth.token" if self.token is not None else "auth.token_file"
            raise ValueError(f"{which} is set but auth.mode is {self.mode!r} (set auth.mode = 'token')")
        elif self.allow_insecure_token:
            raise ValueError(f"auth.allow_insecure_token only applies to auth.mode 'token', not {self.mode!r}")
        return self


class LimitsSettings(SettingsGroup):
    """What one peer can make the coordinator do (coordinator/limits.py,
    docs/decisions.md D24). A peer is the client's certificate CN in mTLS
    mode, else its host (an IPv6 /64): with token auth, clients behind one
    NAT share the per-peer limits; raise them for such deployments."""

    #: A Session stream that sent no Hello within this many seconds is
    #: ended with DEADLINE_EXCEEDED.
    hello_timeout_s: PositiveFloat = 10.0
    #: Concurrent Session streams, with or without Hello; the next one is
    #: refused with RESOURCE_EXHAUSTED before anything else runs.
    max_streams: PositiveInt = 1024
    #: Concurrent Session streams of one peer (max_streams bounds it too).
    max_streams_per_peer: PositiveInt = 256
    #: New Session streams per second per peer (token bucket of `session_burst`).
    session_rate: PositiveFloat = 5.0
    session_burst: PositiveInt = 50
    #: Enroll calls per second per peer (token bucket of `enroll_burst`).
    enroll_rate: PositiveFloat = 2.0
    enroll_burst: PositiveInt = 20
    #: Control messages (Heartbeat, CheckIn) per second per
    #: stream (token bucket of `message_burst`); stage messages are bounded
    #: by the round machine (one per device and stage).
    message_rate: PositiveFloat = 5.0
    message_burst: PositiveInt = 50
    #: Devices one Hello or CheckIn may announce.
    max_announced_devices: Annotated[int, Field(ge=1, le=100_000)] = 10_000
    #: Announced ids the registry does not know are looked up in the store
    #: (one by one, at most `max_device_lookups` per look-up) at most once
    #: per this many seconds; the others are rejected as unknown.
    device_lookup_interval_s: Annotated[float, Field(ge=0.0)] = 1.0
    max_device_lookups: Annotated[int, Field(ge=1, le=100_000)] = 256


class AdminListenerSettings(SettingsGroup):
    """The admin gRPC listener (fedmask.v1.CoordinatorAdmin: live state,
    events, operator actions, the top-k relay), separate from the devices'
    listener so a network policy can keep devices away from it (D40).
    Its credential is never a flag: `token` only from the environment
    (FEDMASK_ADMIN__TOKEN) or the TOML file, or `token_file`, or just the
    token's SHA-256 (`token_sha256`); the coordinator keeps only the hash."""

    #: HOST:PORT of the admin listener; None (default): no admin listener.
    listen: ListenAddress | None = None
    #: token: "authorization: Bearer <admin token>"; mtls: a client
    #: certificate of the federation CA whose role (subject OU) is "admin"
    #: (`fedmask certs issue-admin`), over the coordinator's tls.* files;
    #: none: no credential, loopback only (tests).
    auth: Literal["token", "mtls", "none"] = "token"
    token: SecretStr | None = None
    #: A file of accepted admin tokens, one per line (blank and "#" lines
    #: ignored), re-read when it changes: the admin token rotates without a
    #: restart (add the new one, move the admin service, remove the old).
    token_file: FilePath | None = None
    #: Hex SHA-256 of the admin token (the token itself need not be here).
    token_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    #: Events a watcher may fall behind before it is dropped.
    watcher_queue: Annotated[int, Field(ge=1, le=100_000)] = 1024
    #: Concurrent WatchEvents streams.
    max_watchers: Annotated[int, Field(ge=1, le=10_000)] = 64
    #: Default and largest wait for a device's top-k answer, in seconds.
    top_k_timeout_s: Annotated[float, Field(gt=0.0, le=300.0)] = 10.0
    #: The largest k a top-k request may ask for (D84); each device also
    #: answers at most its own cap (`fedmask client --max-top-k`).
    max_top_k: Annotated[int, Field(ge=1, le=MAX_TOP_K_LIMIT)] = DEFAULT_MAX_TOP_K

    @model_validator(mode="after")
    def _one_credential(self) -> AdminListenerSettings:
        given = [n for n in ("token", "token_file", "token_sha256") if getattr(self, n) is not None]
        if self.auth == "token":
            if self.listen is not None and len(given) != 1:
                raise ValueError("admin.auth 'token' needs exactly one of admin.token (env FEDMASK_ADMIN__TOKEN), "
                                 f"admin.token_file, admin.token_sha256; got {given or 'none'}")
            if self.token is not None and len(self.token.get_secret_value()) < MIN_TOKEN_LENGTH:
                raise ValueError(f"admin.token must be at least {MIN_TOKEN_LENGTH} characters")
        elif given:
            raise ValueError(f"{', '.join('admin.' + g for g in given)} set but admin.auth is {self.auth!r}")
        if self.auth == "none" and self.listen is not None and not is_loopback(split_host_port(self.listen)[0]):
            raise ValueError(f"admin.auth 'none' is only allowed on a loopback admin.listen, not {self.listen!r}")
        return self


class MetricsSettings(SettingsGroup):
    #: HOST:PORT of the Prometheus endpoint (GET /metrics); None: off.
    listen: ListenAddress | None = None


class DebugSettings(SettingsGroup):
    #: DEBUG ONLY. Write each round's decoded sum (first `sum_coordinates`
    #: coordinates, its L1/L2 norms and an exact checksum of the encoded
    #: sum) into the round record's metrics, so tests can compare it with
    #: the devices' plaintext sum. Refused unless the coordinator listens
    #: on a loopback address. The server learns this sum anyway (it is the
    #: secagg output); the flag only persists it where the admin shows it.
    record_sums: bool = False
    sum_coordinates: Annotated[int, Field(ge=0, le=4096)] = 16
    #: INSECURE, DEBUG ONLY (benchmark baseline): rounds without secure
    #: aggregation; devices send their encoded updates unmasked and the
    #: server sums them (coordinator/plaintext.py). Loopback only; edge
    #: clients must opt in with --debug-allow-insecure-plaintext.
    insecure_plaintext: bool = False


class HybridSettings(SettingsGroup):
    #: UNPROTECTED UPDATES (FedMMF hybrid rounds, coordinator/hybrid.py,
    #: docs/decisions.md D64-D66). A device whose FedMMF privacy indicator J
    #: (the mean squared residual of its personalised mask on its own
    #: ratings) is at most this bound, and at most its client's own
    #: --unprotected-plaintext-j-bound, sends its update in PLAINTEXT: the
    #: coordinator learns that device's item-factor update and which path
    #: every device took. None (default): every update goes through secure
    #: aggregation. Needs TLS on the device listener, model.name "fedmmf",
    #: and no distributed DP noise.
    unprotected_plaintext_j_bound: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] | None = None

    @property
    def enabled(self) -> bool:
        return self.unprotected_plaintext_j_bound is not None


class CoordinatorSettings(LayeredSettings):
    """All coordinator settings (see module docstring for the sources; the
    loader is fedmask_settings.LayeredSettings.load)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX)
    config_env: ClassVar[str] = CONFIG_ENV

    #: gRPC listen address, HOST:PORT ("[::]:50051" for IPv6).
    listen_address: ListenAddress = "127.0.0.1:50051"
    #: sqlite:///FILE (default), postgresql+psycopg://..., or memory://.
    database_url: Annotated[str, AfterValidator(check_database_url)] = "sqlite:///./fedmask.db"
    model: ModelSettings = Field(default_factory=ModelSettings)
    cohort: CohortSettings = Field(default_factory=CohortSettings)
    deadlines: DeadlineSettings = Field(default_factory=DeadlineSettings)
    secagg: SecaggSettings = Field(default_factory=SecaggSettings)
    dp: DpSettings = Field(default_factory=DpSettings)
    tls: TlsSettings = Field(default_factory=TlsSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    admin: AdminListenerSettings = Field(default_factory=AdminListenerSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    debug: DebugSettings = Field(default_factory=DebugSettings)
    hybrid: HybridSettings = Field(default_factory=HybridSettings)
    replica: ReplicaSettings = Field(default_factory=ReplicaSettings)
    #: Ask the devices for round metrics (totals through the secure sum, D35);
    #: off: no metric leaves a device, and rounds record only contributors
    #: and cohort (the metric totals are not covered by DP, D36).
    round_metrics: bool = True
    #: Stop after this many rounds (committed or aborted); None: run until stopped.
    rounds: PositiveInt | None = None
    #: Seed of cohort selection and session ids' non-secret parts; None: OS entropy.
    seed: int | None = None
    #: Clients must send a heartbeat this often; 3 silent intervals close the session.
    heartbeat_interval: PositiveFloat = 10.0
    #: gRPC max receive message size in bytes; None: sized from the model
    #: (one MaskedInput of 4 * update_dim bytes) and the cohort (a ShareKeys
    #: of cohort-1 shares), with headroom. The send limit is unlimited.
    max_receive_message_bytes: Annotated[int, Field(ge=1 << 16)] | None = None
    #: A second, plaintext listener HOST:PORT that serves only grpc.health.v1
    #: (container healthchecks, Kubernetes gRPC probes, which cannot speak
    #: TLS); the same status as the main port. None: no such listener.
    health_listen_address: ListenAddress | None = None
    #: At start, how long to keep retrying a database server that cannot be
    #: reached yet (started in parallel by compose or Kubernetes), with
    #: backoff; 0 fails at once. SQLite and memory:// are never retried.
    database_wait_s: Annotated[float, Field(ge=0)] = 60.0

    @model_validator(mode="after")
    def _auth_fits_transport(self) -> CoordinatorSettings:
        if self.auth.mode == "mtls":
            if not (self.tls.enabled and self.tls.client_ca is not None and self.tls.require_client_cert):
                raise ValueError(
                    "auth.mode 'mtls' needs tls.cert, tls.key, tls.client_ca and tls.require_client_cert = true"
                )
        if self.debug.record_sums and not is_loopback(split_host_port(self.listen_address)[0]):
            raise ValueError("debug.record_sums is only allowed on a loopback listen_address (tests, benchmarks)")
        if self.debug.insecure_plaintext and not is_loopback(split_host_port(self.listen_address)[0]):
            raise ValueError("debug.insecure_plaintext is only allowed on a loopback listen_address (benchmarks)")
        if self.hybrid.enabled:
            if not self.tls.enabled:
                raise ValueError(
                    "hybrid.unprotected_plaintext_j_bound sends some devices' updates in plaintext: it needs TLS on "
                    "the device listener (tls.cert and tls.key), so that only the coordinator can read them"
                )
            if self.model.name != "fedmmf":
                raise ValueError("hybrid.unprotected_plaintext_j_bound is FedMMF's policy (its privacy indicator J): "
                                 f"model.name must be 'fedmmf', not {self.model.name!r}")
            if self.dp.mode == "distributed" and self.dp.noise_multiplier > 0:
                raise ValueError(
                    "hybrid.unprotected_plaintext_j_bound cannot be combined with dp.mode 'distributed': a plaintext "
                    "update carries only its 1/cohort share of the noise, so no epsilon would cover it"
                )
            if self.debug.insecure_plaintext:
                raise ValueError("hybrid.unprotected_plaintext_j_bound and debug.insecure_plaintext exclude each other")
        if self.dp.dropouts == "remove" and self.secagg.graph != "full":
            raise ValueError("dp.dropouts 'remove' needs secagg.graph 'full' (one threshold t for the whole sum)")
        if self.dp.dropouts == "remove" and (self.hybrid.enabled or self.debug.insecure_plaintext):
            raise ValueError("dp.dropouts 'remove' runs only on secure sums (no hybrid or plaintext rounds)")
        from coordinator.round_groups import groups_refusal

        grouped_refusal = groups_refusal(group_size=self.secagg.group_size, selected=self.cohort.selected,
                                         plaintext=self.debug.insecure_plaintext, hybrid=self.hybrid.enabled,
                                         removable=self.dp.dropouts == "remove")
        if grouped_refusal is not None:
            raise ValueError(grouped_refusal)
        if self.auth.mode == "none" and not is_loopback(split_host_port(self.listen_address)[0]):
            raise ValueError(
                f"auth.mode 'none' is only allowed on a loopback listen_address, not {self.listen_address!r}"
            )
        if self.admin.listen is not None:
            if self.admin.listen == self.listen_address and split_host_port(self.listen_address)[1] != 0:
                raise ValueError("admin.listen must differ from listen_address (the admin listener is its own port)")
            if self.admin.auth == "mtls" and not (self.tls.enabled and self.tls.client_ca is not None):
                raise ValueError("admin.auth 'mtls' needs tls.cert, tls.key and tls.client_ca")
            if (self.admin.auth == "token" and not self.tls.enabled
                    and not is_loopback(split_host_port(self.admin.listen)[0])):
                raise ValueError(f"admin.auth 'token' without TLS on the non-loopback admin.listen {self.admin.listen!r} "
                                 "would send the admin token in clear: set tls.cert and tls.key")
        if self.token_in_clear and not self.auth.allow_insecure_token:
            raise ValueError(
                f"auth.mode 'token' without TLS on the non-loopback listen_address {self.listen_address!r} would "
                "send the bearer token over the network in clear: set tls.cert and tls.key, or accept that "
                "with auth.allow_insecure_token = true (flag --insecure-token-without-tls)"
            )
        return self

    @model_validator(mode="after")
    def _replica_mode_fits(self) -> CoordinatorSettings:
        if self.replica.mode == "active":
            refusal = active_replica_refusal(database_url=self.database_url,
                                             plaintext=self.debug.insecure_plaintext, hybrid=self.hybrid.enabled)
            if refusal is not None:
                raise ValueError(refusal)
        return self

    @property
    def token_in_clear(self) -> bool:
        """Token mode without TLS on a non-loopback listen address."""
        return (self.auth.mode == "token" and not self.tls.enabled
                and not is_loopback(split_host_port(self.listen_address)[0]))

    @classmethod
    def format_validation_error(cls, exc: ValidationError, *, source: str | Path | None = None) -> str:
        return format_validation_error(exc, source=source)


def format_validation_error(exc: ValidationError, *, source: str | Path | None = None) -> str:
    """One line per problem: dotted field, its env variable, message, value.
    Errors of the alternatives of one union field are merged into one line."""
    problems: dict[str, tuple[list[str], str]] = {}
    for err in exc.errors():
        path = _field_path(err["loc"])
        value = err.get("input")
        leaf = bool(path) and not isinstance(value, dict)
        if err["type"] == "extra_forbidden":  # an unknown key: name it, no env var
            path = ".".join(str(p) for p in err["loc"])
            problems.setdefault(path, ([], ""))[0].append("unknown setting (Extra inputs are not permitted)")
            continue
        where = f"{path} (env {ENV_PREFIX}{path.upper().replace('.', '__')})" if leaf else (path or "settings")
        shown = ""
        if leaf:
            shown = " [got <redacted>]" if "token" in path else f" [got {value!r}]"
        messages, _ = problems.setdefault(where, ([], shown))
        msg = str(err["msg"]).removeprefix("Value error, ")
        if msg not in messages:
            messages.append(msg)
    lines = [f"invalid coordinator settings ({len(problems)} problem(s)):"]
    lines += [f"  - {where}: {' | '.join(msgs)}{shown}" for where, (msgs, shown) in problems.items()]
    if source is not None:
        lines.append(f"  (config file: {source})")
    return "\n".join(lines)


def _field_path(loc: tuple[int | str, ...]) -> str:
    """The dotted settings field of an error location, without pydantic's
    union-member tags and dict keys."""
    parts: list[str] = []
    model: type[BaseModel] | None = CoordinatorSettings
    for part in loc:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            break
        parts.append(part)
        annotation = model.model_fields[part].annotation
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return ".".join(parts)


def split_host_port(address: str) -> tuple[str, int]:
    """"host:port" / "[v6]:port" -> (host, port); ValueError if malformed
    (the message calls it a listen address)."""
    return _split_host_port(address, what="listen address")

