"""The settings loader of the two services (coordinator/settings.py and
admin/settings.py): a pydantic-settings model filled from four sources,
highest precedence first, nested groups merged key by key:

  1. flags      `overrides` mapping, dotted keys ({"cohort.size": 50}); None
                values mean "flag not given" and are dropped. Keys in the
                model's `secret_keys` (or under them) are refused: a flag
                shows in `ps` and in shell history.
  2. env        <env_prefix><FIELD>, nested with "__" (the model's
                `model_config["env_prefix"]`), dicts and lists as JSON
  3. file       a TOML file: `config_file`, else the file named by the
                environment variable `config_env`
  4. defaults   the model's

Every problem is reported at once as one `SettingsError`, worded by the
model's `format_validation_error`. Unknown keys are errors (extra="forbid").
This package imports only pydantic and pydantic-settings, so both services
may use it (the import-linter contracts in pyproject.toml).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError
from pydantic_settings import BaseSettings, InitSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict


class SettingsError(ValueError):
    """Invalid configuration; the message lists every problem."""


class SettingsGroup(BaseModel):
    """A nested group of settings (a TOML table): unknown keys are errors and
    the values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


#: The parsed TOML file while `LayeredSettings.load` builds a model: the
#: lowest-precedence source above the defaults.
_CONFIG_DATA: ContextVar[dict[str, Any] | None] = ContextVar("fedmask_settings_config_data", default=None)


class LayeredSettings(BaseSettings):
    """A service's settings, built by `load` from flags, env, file, defaults.

    A subclass sets `model_config = SettingsConfigDict(env_prefix=...)` (the
    rest of the configuration below is inherited), `config_env`, optionally
    `secret_keys`, and `format_validation_error`."""

    model_config = SettingsConfigDict(
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        validate_default=True,
    )

    #: The environment variable naming the TOML file when `load` is given none.
    config_env: ClassVar[str]
    #: Dotted keys that may come from env or file only, never from a flag.
    secret_keys: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        data = _CONFIG_DATA.get()
        if data:
            sources.append(InitSettingsSource(settings_cls, init_kwargs=data))
        return tuple(sources)

    @classmethod
    def load(cls, *, config_file: str | Path | None = None, overrides: Mapping[str, Any] | None = None) -> Self:
        """Build the settings from flags (`overrides`), env, file, defaults.
        Raises SettingsError with every problem listed; a secret among the
        overrides is refused (secrets come from env or file only)."""
        given = {k for k, v in (overrides or {}).items() if v is not None}
        secret = sorted(k for k in given
                        if k in cls.secret_keys or any(k.startswith(s + ".") for s in cls.secret_keys))
        if secret:
            raise SettingsError(f"{', '.join(secret)}: secrets are read from the environment or the config file, "
                                "never from a flag")
        path = config_file if config_file is not None else os.environ.get(cls.config_env) or None
        file_data = read_config_file(Path(path)) if path is not None else {}
        with _config_data(file_data):
            try:
                return cls(**unflatten(overrides or {}))
            except ValidationError as exc:
                raise SettingsError(cls.format_validation_error(exc, source=path)) from None

    @classmethod
    def format_validation_error(cls, exc: ValidationError, *, source: str | Path | None = None) -> str:
        """The SettingsError message for `exc`: one line per problem, naming
        the dotted field and its env variable, secrets never shown."""
        raise NotImplementedError(f"{cls.__name__} does not say how its settings errors read")


@contextmanager
def _config_data(data: dict[str, Any]) -> Iterator[None]:
    token = _CONFIG_DATA.set(data)
    try:
        yield
    finally:
        _CONFIG_DATA.reset(token)


def read_config_file(path: Path) -> dict[str, Any]:
    """The parsed TOML file; SettingsError if missing or malformed."""
    if path.suffix.lower() not in (".toml", ""):
        raise SettingsError(f"config file {path}: only TOML is supported (got {path.suffix})")
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise SettingsError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"config file {path} is not valid TOML: {exc}") from None


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    """{"cohort.size": 5, "listen_address": x} -> {"cohort": {"size": 5}, ...};
    None values are dropped (an option that was not given)."""
    nested: dict[str, Any] = {}
    for dotted, value in flat.items():
        if value is None:
            continue
        *parents, leaf = dotted.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise SettingsError(f"override {dotted!r} conflicts with a scalar override of {part!r}")
        node[leaf] = value
    return nested


def split_host_port(address: str, *, what: str = "address") -> tuple[str, int]:
    """"host:port" / "[v6]:port" -> (host, port); ValueError if malformed
    (the message calls the value `what`)."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"{what} must be HOST:PORT, got {address!r}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} is out of range 0..65535")
    if host.startswith("["):
        if not host.endswith("]"):
            raise ValueError(f"malformed IPv6 address in {address!r}")
        host = host[1:-1]
    return host, port


def host_port_check(what: str = "address") -> AfterValidator:
    """The validator of a HOST:PORT setting, `Annotated[str, host_port_check(what)]`:
    the value is kept as given; a malformed one fails with split_host_port's
    message, which calls it `what`."""

    def check(value: str) -> str:
        split_host_port(value, what=what)
        return value

    return AfterValidator(check)


__all__ = ["LayeredSettings", "SettingsError", "SettingsGroup", "host_port_check", "read_config_file", "split_host_port",
           "unflatten"]
