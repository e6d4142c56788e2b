"""Admin-service configuration: `AdminSettings.load(...)`.

Sources, highest precedence first (nested groups merged key by key), read
by the loader the coordinator's settings use too (fedmask_settings):
  1. flags      `overrides` mapping, dotted keys ({"coordinator.address": x});
                None values mean "flag not given" and are dropped. Secrets
                are refused here (SECRET_KEYS): a flag shows in `ps` and in
                shell history.
  2. env        FEDMASK_ADMIN_<FIELD>, nested with "__":
                FEDMASK_ADMIN_COORDINATOR__TOKEN=...,
                FEDMASK_ADMIN_TOKENS='[{"name": "ops", "role": "operator",
                "sha256": "..."}]'
  3. file       a TOML file: `config_file`, else $FEDMASK_ADMIN_CONFIG;
                top-level keys, [coordinator], [limits], [event_streams],
                [[tokens]]
  4. defaults   below

The API's bearer tokens are stored only as their SHA-256 (`fedmask
admin-token` prints the entry for a new token); see admin/auth.py for why a
fast hash is the right one for random tokens (D45). Every problem is
reported at once as a `SettingsError` naming the dotted field and its env
variable; secret values are never echoed. Unknown keys are errors.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import (
    AfterValidator,
    Field,
    FilePath,
    PositiveFloat,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import SettingsConfigDict

# SettingsError and split_host_port are this module's too (callers import them from here).
from coordinator.store.url import check_database_url
from fedmask_settings import LayeredSettings, SettingsError, SettingsGroup, host_port_check, split_host_port
from wire.protocol import DEFAULT_MAX_TOP_K, MAX_TOP_K_LIMIT, is_loopback

ENV_PREFIX = "FEDMASK_ADMIN_"
CONFIG_ENV = "FEDMASK_ADMIN_CONFIG"
#: Settings that may come from env or file only, never from a flag.
SECRET_KEYS = frozenset({"coordinator.token", "tokens"})
#: Seconds a top-k call may take beyond the coordinator's wait for the
#: device (the relay's own time; admin/live.py).
TOPK_MARGIN_S = 2.0
#: The nested groups (env FEDMASK_ADMIN_<GROUP>__<FIELD>).
_GROUPS = frozenset({"coordinator", "limits", "event_streams"})


class Role(StrEnum):
    """What a bearer token may do (admin/auth.py has the route rules)."""

    #: Read the federation's state and history, and /metrics.
    VIEWER = "viewer"
    #: Ask for top-k recommendations, nothing else.
    RECOMMENDER = "recommender"
    #: Everything: reads, top-k and operator actions.
    OPERATOR = "operator"


class TokenEntry(SettingsGroup):
    """One accepted API token, by its hash."""

    #: Who holds it; recorded as the actor of operator actions. Never the token.
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.@\-]{0,63}$")]
    role: Role
    #: Lower-case hex SHA-256 of the token's UTF-8 bytes.
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class CoordinatorLink(SettingsGroup):
    """How the admin service reaches the coordinator's gRPC admin listener."""

    #: HOST:PORT of the admin listener (not the devices' listener).
    address: Annotated[str, host_port_check()] = "127.0.0.1:50052"
    #: The admin service's own credential on that listener (bearer token).
    #: Env or file only.
    token: SecretStr | None = None
    #: CA bundle (PEM) the listener's certificate must chain to; enables TLS.
    tls_ca: FilePath | None = None
    #: Client certificate and key (PEM) for mTLS with an admin role.
    tls_cert: FilePath | None = None
    tls_key: FilePath | None = None
    #: Seconds a status or action call may take.
    call_timeout_s: PositiveFloat = 5.0
    #: Seconds the coordinator waits for a device's top-k answer.
    topk_timeout_s: Annotated[float, Field(gt=0, le=60)] = 5.0
    #: GET /v1/rounds/current and /v1/federation answer from a live state
    #: fetched at most this many seconds ago without calling the coordinator
    #: (admin/live_cache.py, D58); 0 with live_state_stale_s 0: no cache.
    live_state_max_age_s: Annotated[float, Field(ge=0, le=10)] = 0.25
    #: ... and from one up to this old while a single refresh runs.
    live_state_stale_s: Annotated[float, Field(ge=0, le=10)] = 1.0

    @model_validator(mode="after")
    def _consistent(self) -> CoordinatorLink:
        if self.live_state_max_age_s > self.live_state_stale_s:
            raise ValueError("coordinator.live_state_max_age_s must not exceed coordinator.live_state_stale_s")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("coordinator.tls_cert and coordinator.tls_key must be given together")
        if self.tls_cert is not None and self.tls_ca is None:
            raise ValueError("coordinator.tls_cert needs coordinator.tls_ca (mTLS needs TLS)")
        host = split_host_port(self.address)[0]
        if self.token is not None and self.tls_ca is None and not is_loopback(host):
            raise ValueError(f"coordinator.token without coordinator.tls_ca to the non-loopback {self.address!r} "
                             "would send the admin credential in clear: set coordinator.tls_ca")
        return self


class RequestLimits(SettingsGroup):
    """What one HTTP request may cost the service, checked before its token
    and before a route reads its body (D82): the request head in uvicorn's
    protocol (`fedmask/commands/admin_http.py`), the rest in the app's
    outermost middleware (admin/request_gate.py). A refusal is answered at
    once and the connection closed behind it."""

    #: Bytes of a request head (request line and headers): more is 431 and
    #: the connection is closed; what was read of it stays below this plus
    #: one socket read (256 KiB).
    max_header_bytes: Annotated[int, Field(ge=1024, le=1 << 20)] = 16 * 1024
    #: Bytes of a request body for the routes that take one (the operator
    #: actions' {"reason": ...}); the routes that take none refuse any body.
    #: More is 413, by its Content-Length before reading it, or once the
    #: bytes read pass the bound.
    max_body_bytes: Annotated[int, Field(ge=1024, le=1 << 20)] = 16 * 1024
    #: Requests served at once (event streams apart: they have their slots,
    #: `event_streams`); one more is 503 with Retry-After at once.
    max_concurrent_requests: Annotated[int, Field(ge=1, le=10_000)] = 64
    #: Open connections and requests of uvicorn (its `limit_concurrency`):
    #: beyond it every new request is 503. Must leave room for the
    #: concurrent requests and the event streams.
    max_connections: Annotated[int, Field(ge=2, le=100_000)] = 1024
    #: Seconds from a request's head to the end of its answer (event streams
    #: apart): past it, 503 if no answer started, else the connection closes.
    request_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 30.0
    #: Seconds a request head may take once its first byte arrived (or the
    #: connection opened): past it, 408 and the connection closes.
    head_timeout_s: Annotated[float, Field(gt=0, le=300)] = 10.0
    #: Refused operator actions (403) of one token written to the
    #: coordinator's audit log per minute (burst as many); the rest are
    #: counted into the next entry's `suppressed`.
    refusal_audits_per_minute: Annotated[int, Field(ge=1, le=600)] = 6


class EventStreamSlots(SettingsGroup):
    """How the /v1/events streams of one admin-service process are shared
    (D82). Each stream holds one WatchEvents watcher at the coordinator, so
    replicas x max_streams should stay within the coordinator's
    admin.max_watchers."""

    #: Streams open at once in this process.
    max_streams: Annotated[int, Field(ge=1, le=10_000)] = 32
    #: Streams one token (one settings entry) may hold at once: one more is 429.
    per_token: Annotated[int, Field(ge=1, le=10_000)] = 4
    #: Of max_streams, the ones only operator tokens may take: a viewer's
    #: stream beyond max_streams - operator_reserved is 503.
    operator_reserved: Annotated[int, Field(ge=0, le=10_000)] = 4

    @model_validator(mode="after")
    def _fits(self) -> EventStreamSlots:
        if self.operator_reserved >= self.max_streams:
            raise ValueError("event_streams.operator_reserved must be below event_streams.max_streams")
        if self.per_token > self.max_streams:
            raise ValueError("event_streams.per_token must not exceed event_streams.max_streams")
        return self


class AdminSettings(LayeredSettings):
    """All admin-service settings (see the module docstring for the sources;
    the loader is fedmask_settings.LayeredSettings.load)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX)
    config_env: ClassVar[str] = CONFIG_ENV
    secret_keys: ClassVar[frozenset[str]] = SECRET_KEYS

    #: HTTP listen address HOST:PORT.
    listen_address: Annotated[str, host_port_check()] = "127.0.0.1:8080"
    #: The coordinator's store, read only: sqlite:///FILE or postgresql+psycopg://...
    database_url: Annotated[str, AfterValidator(check_database_url)] = "sqlite:///./fedmask.db"
    coordinator: CoordinatorLink = Field(default_factory=CoordinatorLink)
    #: Accepted API tokens (hashed). Env or file only.
    tokens: list[TokenEntry] = Field(default_factory=list)
    #: Default and largest page of a listing.
    page_size: Annotated[int, Field(ge=1, le=1000)] = 50
    max_page_size: Annotated[int, Field(ge=1, le=10_000)] = 500
    #: Seconds between SSE keep-alive comments on a quiet event stream.
    sse_keepalive_s: PositiveFloat = 15.0
    #: Seconds a 503 answer tells the client to wait (Retry-After).
    retry_after_s: Annotated[int, Field(ge=1, le=3600)] = 5
    #: The largest k a top-k request may ask for (D84); a larger one is a 422.
    #: The coordinator (admin.max_top_k) and each device have caps of their own.
    max_top_k: Annotated[int, Field(ge=1, le=MAX_TOP_K_LIMIT)] = DEFAULT_MAX_TOP_K
    #: What one request may cost (sizes, concurrency, time; D82).
    limits: RequestLimits = Field(default_factory=RequestLimits)
    #: How the event streams are shared between tokens (D82).
    event_streams: EventStreamSlots = Field(default_factory=EventStreamSlots)

    @field_validator("tokens")
    @classmethod
    def _unique_tokens(cls, value: list[TokenEntry]) -> list[TokenEntry]:
        names = [t.name for t in value]
        hashes = [t.sha256 for t in value]
        if len(set(names)) != len(names):
            raise ValueError("token names must be unique (they name the actor in the audit log)")
        if len(set(hashes)) != len(hashes):
            raise ValueError("the same token is listed twice")
        return value

    @model_validator(mode="after")
    def _page_sizes(self) -> AdminSettings:
        if self.page_size > self.max_page_size:
            raise ValueError(f"page_size ({self.page_size}) must be <= max_page_size ({self.max_page_size})")
        return self

    @model_validator(mode="after")
    def _connections_fit(self) -> AdminSettings:
        need = self.limits.max_concurrent_requests + self.event_streams.max_streams
        if self.limits.max_connections <= need:
            raise ValueError(f"limits.max_connections ({self.limits.max_connections}) must exceed "
                             f"limits.max_concurrent_requests + event_streams.max_streams ({need})")
        slowest = max(self.coordinator.call_timeout_s, self.coordinator.topk_timeout_s + TOPK_MARGIN_S)
        if self.limits.request_timeout_s <= slowest:
            raise ValueError(f"limits.request_timeout_s ({self.limits.request_timeout_s:g}) must exceed the "
                             f"longest call to the coordinator ({slowest:g} s: coordinator.call_timeout_s, "
                             f"coordinator.topk_timeout_s + {TOPK_MARGIN_S:g})")
        return self

    @classmethod
    def format_validation_error(cls, exc: ValidationError, *, source: str | Path | None = None) -> str:
        return format_validation_error(exc, source=source)


def format_validation_error(exc: ValidationError, *, source: str | Path | None = None) -> str:
    """One line per problem: dotted field, its env variable, message and,
    unless it is a secret, the offending value."""
    lines: list[str] = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        path = ".".join(loc)
        top = ".".join(p for p in loc if not p.isdigit())
        secret = any(top == s or top.startswith(s + ".") for s in SECRET_KEYS)
        env = f"{ENV_PREFIX}{(loc[0] if loc else '').upper()}" + ("".join(f"__{p.upper()}" for p in loc[1:2])
                                                                 if loc and loc[0] in _GROUPS else "")
        msg = str(err["msg"]).removeprefix("Value error, ")
        value = err.get("input")
        shown = "" if secret or isinstance(value, dict | list) or err["type"] == "extra_forbidden" else f" [got {value!r}]"
        lines.append(f"  - {path or 'settings'} (env {env}): {msg}{shown}")
    head = f"invalid admin settings ({len(lines)} problem(s)):"
    tail = [f"  (config file: {source})"] if source is not None else []
    return "\n".join([head, *lines, *tail])

