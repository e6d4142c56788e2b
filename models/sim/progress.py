"""Progress of a long job: a rich bar on a terminal, plain lines in a log.

    with Progress("ease grid", total=6, unit="fit") as p:
        for lam in grid:
            ...
            p.advance(status=f"lam {lam:g}: val hr@10 0.701")

- On a terminal (the stream's `isatty()`), a rich progress bar with the
  completed/total count, the status text, elapsed and remaining time.
- Otherwise (output redirected to a file, CI), one plain line at the start, then
  at most one line every `interval` seconds when something advanced, and one at
  the end, e.g. `[progress] ease grid: 3/6 fit, 12.0 s elapsed, ~12.0 s left
  (lam 200: val hr@10 0.701)`. The estimate assumes the remaining steps take as
  long as the completed ones on average ("?" before the first step).
- `mode="off"` prints nothing. `note(text)` prints a line in both modes.

Contract: steps are counted, never timed individually; `advance` and `update`
are cheap (no I/O unless a line is due), so they can be called every step.
The clock and the stream are arguments so tests control them.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal, TextIO

Mode = Literal["auto", "bar", "lines", "off"]

DEFAULT_INTERVAL_S = 30.0


def _fmt_seconds(s: float) -> str:
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


class Progress:
    """Counts `total` steps of one job and reports them (see the module docstring)."""

    def __init__(
        self,
        description: str,
        total: int | None = None,
        *,
        unit: str = "step",
        mode: Mode = "auto",
        stream: TextIO | None = None,
        interval: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval < 0:
            raise ValueError(f"interval must be >= 0, not {interval}")
        if total is not None and total < 0:
            raise ValueError(f"total must be >= 0, not {total}")
        self.description = description
        self.total = total
        self.unit = unit
        self.stream = sys.stderr if stream is None else stream
        self.interval = interval
        self.clock = clock
        if mode == "auto":
            isatty = getattr(self.stream, "isatty", None)
            mode = "bar" if callable(isatty) and isatty() else "lines"
        self.mode: Mode = mode
        self.completed = 0
        self.status = ""
        self._start = clock()
        self._last_line = self._start
        self._dirty = False
        self._closed = False
        self._bar: Any = None
        self._task: Any = None
        if self.mode == "bar":
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(description, total=total, status="")
        elif self.mode == "lines":
            self._line("started")

    # ------------------------------------------------------------ reporting

    def elapsed(self) -> float:
        return self.clock() - self._start

    def remaining(self) -> float | None:
        """Seconds left by the average step so far; None when unknown."""
        if self.total is None or self.completed <= 0:
            return None
        return self.elapsed() / self.completed * max(self.total - self.completed, 0)

    def line(self, state: str = "") -> str:
        """The plain progress line (what `lines` mode prints)."""
        count = f"{self.completed}/{self.total}" if self.total is not None else f"{self.completed}"
        left = self.remaining()
        eta = "?" if left is None else _fmt_seconds(left)
        text = f"[progress] {self.description}: {count} {self.unit}, {_fmt_seconds(self.elapsed())} elapsed"
        if self.total is not None:
            text += f", ~{eta} left"
        detail = state or self.status
        return text + (f" ({detail})" if detail else "")

    def _line(self, state: str = "") -> None:
        print(self.line(state), file=self.stream, flush=True)
        self._last_line = self.clock()
        self._dirty = False

    def _maybe_line(self) -> None:
        if self.mode == "lines" and self.clock() - self._last_line >= self.interval:
            self._line()

    def advance(self, steps: int = 1, status: str | None = None) -> None:
        self.update(self.completed + steps, status)

    def update(self, completed: int | None = None, status: str | None = None) -> None:
        if completed is not None:
            self.completed = completed
        if status is not None:
            self.status = status
        self._dirty = True
        if self.mode == "bar":
            self._bar.update(self._task, completed=self.completed, status=self.status)
        self._maybe_line()

    def note(self, text: str) -> None:
        """A one-off message (above the bar, or as its own line)."""
        if self.mode == "bar":
            self._bar.console.print(text)
        elif self.mode == "lines":
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.mode == "bar":
            self._bar.stop()
        elif self.mode == "lines":
            self._line("done")

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None and self.mode == "lines":
            self._closed = True
            self._line(f"stopped: {exc_type.__name__}")
            return
        self.close()


class NullProgress(Progress):
    """A Progress that reports nothing (the default of library functions)."""

    def __init__(self) -> None:
        super().__init__("", None, mode="off")
