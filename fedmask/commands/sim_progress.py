"""The progress display of `fedmask simulate` and `fedmask study` (the engine only
reports events, `models.sim.events.SimulationEvents`).

On a terminal a rich bar of the rounds; when stderr is a file or a pipe, plain
`[progress]` lines now and then (round, elapsed, estimate, the validation
metric, or how much of a chunked round is done), as `fedmask reference` prints
(models/sim/progress.py). `quiet` prints nothing but the notes (the memory plan).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from models.sim.events import SimulationEvents
from models.sim.progress import DEFAULT_INTERVAL_S, Mode, Progress


class SimulationProgress(SimulationEvents):
    """Shows a simulation's rounds; call `close()` at the end (or use `with`)."""

    def __init__(
        self,
        model: str,
        *,
        quiet: bool = False,
        mode: Mode = "auto",
        stream: TextIO | None = None,
        interval: float = DEFAULT_INTERVAL_S,
    ) -> None:
        self.model = model
        self.mode: Mode = "off" if quiet else mode
        self.stream = sys.stderr if stream is None else stream
        self.interval = interval
        self._rounds: Progress | None = None
        self._init: Progress | None = None

    def _progress(self, description: str, total: int, unit: str) -> Progress:
        return Progress(description, total, unit=unit, mode=self.mode, stream=self.stream, interval=self.interval)

    def note(self, text: str) -> None:
        p = self._rounds or self._init
        if p is not None and p.mode == "bar":
            p.note(text)
        else:
            print(text, file=self.stream, flush=True)

    def chunk_done(self, round_idx: int, devices_done: int, cohort: int) -> None:
        if round_idx < 0:  # the initial private state, made chunk by chunk
            if self._init is None:
                self._init = self._progress(f"{self.model} initial private state", cohort, "devices")
            self._init.update(devices_done)
            if devices_done >= cohort:
                self._init.close()
            return
        if self._rounds is not None:
            self._rounds.update(status=f"round {round_idx + 1}: {devices_done}/{cohort} devices trained")

    def round_started(self, round_idx: int, rounds: int) -> None:
        if self._rounds is None:
            self._rounds = self._progress(f"{self.model} rounds", rounds, "rounds")

    def round_done(self, rec: Mapping[str, Any], best_round: int | None) -> None:
        if self._rounds is None:
            return
        val = rec.get("val")
        status = f"round {rec['round'] + 1}: {rec.get('seconds', math.nan):.1f} s"
        if isinstance(val, Mapping):
            metric = "rmse" if "rmse" in val else "hr@10"
            status += f", val {metric} {val.get(metric, math.nan):.4f} (best round {best_round})"
        self._rounds.advance(status=status)

    def close(self) -> None:
        for p in (self._init, self._rounds):
            if p is not None:
                p.close()

    def __enter__(self) -> SimulationProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
