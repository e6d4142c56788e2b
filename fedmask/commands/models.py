"""`fedmask data ...` and `fedmask simulate`: filled in by the models work (issue 3)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Attach the model-side subcommands to the root app."""
