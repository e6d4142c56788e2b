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
                top-level keys, [coordinator], [[tokens]]
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
                                                                 if loc and loc[0] == "coordinator" else "")
        msg = str(err["msg"]).removeprefix("Value error, ")
        value = err.get("input")
        shown = "" if secret or isinstance(value, dict | list) or err["type"] == "extra_forbidden" else f" [got {value!r}]"
        lines.append(f"  - {path or 'settings'} (env {env}): {msg}{shown}")
    head = f"invalid admin settings ({len(lines)} problem(s)):"
    tail = [f"  (config file: {source})"] if source is not None else []
    return "\n".join([head, *lines, *tail])

