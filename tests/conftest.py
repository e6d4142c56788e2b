"""Fixtures shared by every test package."""

from __future__ import annotations

import ast
import functools
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


def _serialise_ast_parse() -> None:
    """CPython 3.11 keeps the AST constructor's recursion counter in one
    per-interpreter struct, so two threads in `ast.parse` at once (a thread
    switch inside it, e.g. a finalizer run by the collector) can raise
    "SystemError: AST constructor recursion depth mismatch" in either (the
    CPython report "Error in AST recursion depth tracking"). Tests run servers
    in threads while Hypothesis parses sources and tracebacks (which parse
    their lines) are formatted, so the test process takes one lock around
    `ast.parse`. Newer interpreters keep the counter per call."""
    if sys.version_info >= (3, 13):
        return
    lock = threading.RLock()
    parse = ast.parse

    @functools.wraps(parse)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return parse(*args, **kwargs)

    ast.parse = locked


_serialise_ast_parse()

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
