"""Structured logging: one line per event, `event=NAME key=value ...`.

Every value is cut to MAX_LOG_VALUE_CHARS characters (the cut says how many
were left out) and written with repr() when it has spaces, quotes, "=" or
any non-printable character (newlines, carriage returns, escape sequences,
Unicode line separators): a value a client chose cannot grow the log
without bound nor forge a line. `sanitize` does the same for status details
sent back to clients. Nothing secret is ever passed here (tokens, keys and
vectors stay out of logs by construction).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, TextIO

LOGGER_NAME = "fedmask.coordinator"
logger = logging.getLogger(LOGGER_NAME)


MAX_LOG_VALUE_CHARS = 256
MAX_DETAIL_CHARS = 512


def clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters plus a note of how many were cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...[{len(text) - limit} more chars]"


def sanitize(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    """`text` clipped, each non-printable character written as its escape
    (\\n, \\x1b, \\u2028): one safe line, e.g. for a gRPC status detail."""
    text = clip(text, limit)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _fmt(value: Any) -> str:
    text = value if isinstance(value, str) else str(value)
    text = clip(text, MAX_LOG_VALUE_CHARS)
    if not text or any(c in text for c in ' ="\'') or not text.isprintable():
        return repr(text)
    return text


def format_event(event: str, fields: Mapping[str, Any]) -> str:
    return " ".join([f"event={event}", *(f"{k}={_fmt(v)}" for k, v in fields.items())])


def log_event(event: str, level: int = logging.INFO, /, **fields: Any) -> None:
    if logger.isEnabledFor(level):
        logger.log(level, format_event(event, fields))


class _ConsoleHandler(logging.StreamHandler[TextIO]):
    """The console handler configure_logging installs (recognised by its class)."""


def configure_logging(level: str = "INFO") -> None:
    """Console logging for `fedmask coordinator` (idempotent)."""
    root = logging.getLogger("fedmask")
    if not any(isinstance(h, _ConsoleHandler) for h in root.handlers):
        handler = _ConsoleHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        root.addHandler(handler)
    # Our handler prints every line; without this, a library that configures
    # the root logger (dp_accounting's first warning calls logging.basicConfig)
    # would print each line a second time.
    root.propagate = False
    root.setLevel(level.upper())
