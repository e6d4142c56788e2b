"""Fixtures shared by every test package."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The throwaway PostgreSQL server (postgresql_server, postgresql_url) for
# every package's tests: tests/conftest_pg.py, imported as a plugin once.
pytest_plugins = ("conftest_pg",)


@pytest.fixture(scope="session")
def ml100k_data_dir() -> Path:
    """The data folder holding a verified `ml-100k/`.

    Fetched the documented way (the recbole wheel from PyPI, hashes checked)
    when absent, so tests that need the real data never skip.
    """
    from models.data.fetch import fetch_dataset

    data_dir = REPO / "data"
    fetch_dataset("ml-100k", data_dir)  # idempotent: verifies hashes, downloads only if needed
    return data_dir


@pytest.fixture
def command_app():
    """`command_app(register)`: a Typer app holding the commands `register(app)`
    attaches, plus a no-op one, so that a single command stays a named
    subcommand (Typer runs a lone command as the app itself)."""
    import typer

    def build(register) -> typer.Typer:
        app = typer.Typer()
        register(app)

        @app.command("noop")
        def noop() -> None:
            pass

        return app

    return build
