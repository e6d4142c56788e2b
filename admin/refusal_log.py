"""Log lines of refused requests that any caller can repeat at will: at
most one per reason every `interval_s`, with the count of those left out,
so that a flood of refusals stays cheap to log (D82)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

_log = logging.getLogger("fedmask.admin")


class RefusalLog:
    """One log line per reason at most every `interval_s`, with the count of
    those it left out."""

    def __init__(self, interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def __call__(self, reason: str, detail: str) -> None:
        now = self._clock()
        if now - self._last.get(reason, -self._interval) < self._interval:
            self._skipped[reason] = self._skipped.get(reason, 0) + 1
            return
        self._last[reason] = now
        skipped = self._skipped.pop(reason, 0)
        _log.warning("request refused (%s): %s%s", reason, detail, f" ({skipped} more not logged)" if skipped else "")


__all__ = ["RefusalLog"]
