"""The one settings loader (fedmask_settings) and the two services on it:
both load through `LayeredSettings.load` with the configuration they had
(prefix, nesting, unknown keys refused, frozen, defaults validated), and the
precedence flags > environment > file > defaults holds."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import SettingsConfigDict

from admin.settings import AdminSettings
from coordinator.settings import CoordinatorSettings
from fedmask_settings import LayeredSettings, SettingsError, SettingsGroup, split_host_port


class _Inner(SettingsGroup):
    size: int = 1
    token: SecretStr | None = None


class _Demo(LayeredSettings):
    model_config = SettingsConfigDict(env_prefix="FEDMASK_DEMO_")
    config_env: ClassVar[str] = "FEDMASK_DEMO_CONFIG"
    secret_keys: ClassVar[frozenset[str]] = frozenset({"inner.token"})

    name: str = "default"
    inner: _Inner = Field(default_factory=_Inner)

    @classmethod
    def format_validation_error(cls, exc: ValidationError, *, source: str | Path | None = None) -> str:
        return f"demo: {len(exc.errors())} problem(s)"


@pytest.mark.parametrize(("cls", "prefix", "config_env"), [(CoordinatorSettings, "FEDMASK_", "FEDMASK_CONFIG"),
                                                           (AdminSettings, "FEDMASK_ADMIN_", "FEDMASK_ADMIN_CONFIG")])
def test_both_services_load_through_the_one_loader(cls: type[LayeredSettings], prefix: str, config_env: str) -> None:
    assert cls.load.__func__ is LayeredSettings.load.__func__  # type: ignore[attr-defined]
    assert cls.config_env == config_env
    config = cls.model_config
    assert (config.get("env_prefix"), config.get("env_nested_delimiter"), config.get("extra"), config.get("frozen"),
            config.get("validate_default")) == (prefix, "__", "forbid", True, True)


def test_flags_beat_the_environment_which_beats_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toml = tmp_path / "demo.toml"
    toml.write_text('name = "file"\n[inner]\nsize = 3\n')
    monkeypatch.setenv("FEDMASK_DEMO_CONFIG", str(toml))
    assert (_Demo.load().name, _Demo.load().inner.size) == ("file", 3)
    monkeypatch.setenv("FEDMASK_DEMO_INNER__SIZE", "4")
    assert (_Demo.load().name, _Demo.load().inner.size) == ("file", 4)
    loaded = _Demo.load(overrides={"name": "flag", "inner.size": None})
    assert (loaded.name, loaded.inner.size) == ("flag", 4)
    monkeypatch.delenv("FEDMASK_DEMO_CONFIG")
    assert _Demo.load().name == "default"


def test_problems_secrets_and_files_are_settings_errors(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"demo: 1 problem"):
        _Demo.load(overrides={"inner.size": "many"})
    with pytest.raises(SettingsError, match="inner.token: secrets are read from the environment"):
        _Demo.load(overrides={"inner.token": "x" * 20})
    with pytest.raises(SettingsError, match="does not exist"):
        _Demo.load(config_file=tmp_path / "missing.toml")
    with pytest.raises(SettingsError, match="only TOML"):
        _Demo.load(config_file=tmp_path / "demo.yaml")


def test_split_host_port_names_what_it_parses() -> None:
    assert split_host_port("[::1]:8080") == ("::1", 8080)
    with pytest.raises(ValueError, match="^listen address must be HOST:PORT"):
        split_host_port("nohost", what="listen address")
