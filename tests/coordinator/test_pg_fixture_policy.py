"""The throwaway-PostgreSQL fixture must FAIL under CI when no server can be
started, and may only skip (with the reason) outside CI."""

from __future__ import annotations

import sys
from types import ModuleType

import pytest


def _pg_module() -> ModuleType:
    return sys.modules["conftest_pg"]  # a plugin of tests/conftest.py


@pytest.mark.parametrize("value", ["true", "1", "yes"])
def test_unavailable_server_fails_under_ci(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.fail.Exception, match="CI is set"):
        _pg_module()._unavailable("no initdb")


@pytest.mark.parametrize("value", [None, "", "false", "0"])
def test_unavailable_server_skips_outside_ci(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.skip.Exception, match="no initdb"):
        _pg_module()._unavailable("no initdb")


def test_server_binaries_are_found_here() -> None:
    bindir = _pg_module().find_pg_bindir()
    if bindir is None and not _pg_module().in_ci():
        pytest.skip("no PostgreSQL server binaries on this machine")
    assert bindir is not None and (bindir / "initdb").exists()
