"""What a running simulation reports to its caller (both the engine and the
platform-level runner)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class SimulationEvents:
    """What a caller may hear about a running simulation (all optional; the CLI
    turns them into the progress display, models/sim/progress.py)."""

    def note(self, text: str) -> None:
        """A one-off message (the memory plan, the setup time)."""

    def round_started(self, round_idx: int, rounds: int) -> None:
        """Round `round_idx` (0-based) of `rounds` begins."""

    def chunk_done(self, round_idx: int, devices_done: int, cohort: int) -> None:
        """Part of a round's cohort is trained (chunked rounds only; round -1:
        part of the initial private state is made)."""

    def round_done(self, rec: Mapping[str, Any], best_round: int | None) -> None:
        """A round's record (as in results.json) and the best validation round so far."""
