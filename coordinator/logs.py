"""Structured logging: one line per event, `event=NAME key=value ...`.

Values with spaces or quotes are written with repr(); nothing secret is ever
passed here (tokens, keys and vectors stay out of logs by construction).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

LOGGER_NAME = "fedmask.coordinator"
logger = logging.getLogger(LOGGER_NAME)


def _fmt(value: Any) -> str:
    text = str(value)
    if not text or any(c in text for c in ' ="\'\n'):
        return repr(text)
    return text


def format_event(event: str, fields: Mapping[str, Any]) -> str:
    return " ".join([f"event={event}", *(f"{k}={_fmt(v)}" for k, v in fields.items())])


def log_event(event: str, level: int = logging.INFO, /, **fields: Any) -> None:
    if logger.isEnabledFor(level):
        logger.log(level, format_event(event, fields))


def configure_logging(level: str = "INFO") -> None:
    """Console logging for `fedmask coordinator` (idempotent)."""
    root = logging.getLogger("fedmask")
    if not any(getattr(h, "_fedmask", False) for h in root.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        handler._fedmask = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    # Our handler prints every line; without this, a library that configures
    # the root logger (dp_accounting's first warning calls logging.basicConfig)
    # would print each line a second time.
    root.propagate = False
    root.setLevel(level.upper())
