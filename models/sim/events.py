"""What a running simulation reports to its caller (both the engine and the
platform-level runner)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from models.base import GlobalState, divergence_note, diverged


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


def close_round(
    rec: dict[str, Any],
    records: list[dict[str, Any]],
    best_round: int | None,
    state: GlobalState,
    rounds: int,
    events: SimulationEvents,
    on_round: Callable[[dict[str, Any]], None] | None,
) -> bool:
    """Record round `rec["round"]`, tell the caller, and say whether the run stops
    there: True when `state` (the new global parameters) holds a NaN or an
    infinity (the run keeps its best finite round; a note says so)."""
    records.append(rec)
    events.round_done(rec, best_round)
    if on_round is not None:
        on_round(rec)
    if diverged(state):
        events.note(divergence_note(int(rec["round"]), rounds))
        return True
    return False
