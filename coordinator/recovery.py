"""What a coordinator takes over at start-up, as a restarted process or as a
replica that has just become the leader (D90): the rounds it finds
unfinished, and the operator's pause.

- Unfinished rounds are marked aborted (`coordinator_restart`): whoever ran
  them is gone, and their devices discard the round's secrets. Those it
  had asked to unmask are charged in the privacy ledger in the same
  transaction, as if their sums had been released
  (`coordinator/interrupted_charge.py`, D94).
- The federation stays paused if an operator paused it: the pause lives in
  the audit log (the newest pause or resume that changed the state), so a
  failover or a restart never resumes a federation an operator stopped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from coordinator.interrupted_charge import InterruptedCharge
from coordinator.logs import log_event
from coordinator.store import AuditRecord, Store

#: The actions that change the pause, with the outcome that says they did.
_PAUSE_ACTIONS = {"pause": True, "resume": False}
_CHANGED = "ok"
#: Audit entries read per page while looking for the newest pause/resume.
_PAGE = 200


def paused_by_operator(newest_first: Iterable[AuditRecord]) -> bool | None:
    """True / False as the newest pause or resume that changed the state
    left it; None when the entries hold none."""
    for entry in newest_first:
        if entry.action in _PAUSE_ACTIONS and entry.outcome == _CHANGED:
            return _PAUSE_ACTIONS[entry.action]
    return None


def stored_pause(store: Store) -> bool:
    """Whether the audit log leaves the federation paused (read newest first,
    a page at a time, until the newest pause or resume)."""
    before: int | None = None
    while True:
        page = store.list_audit(limit=_PAGE, before=before)
        found = paused_by_operator(page.items)
        if found is not None:
            return found
        if page.next_cursor is None:
            return False
        before = page.next_cursor


async def recover(store: Store, charge: InterruptedCharge | None = None) -> bool:
    """Abort the rounds left unfinished, charging with `charge` those asked
    to unmask; return whether an operator's pause holds (see the module doc)."""
    if charge is not None:  # priced before the transaction, which holds the lease's row (see InterruptedCharge)
        await asyncio.to_thread(lambda: charge.warm(store.list_rounds(limit=_PAGE).items, store.privacy_ledger()))
    interrupted = await asyncio.to_thread(store.mark_interrupted_rounds_aborted, charge=charge)
    if interrupted:
        log_event("rounds_marked_aborted", logging.WARNING, rounds=",".join(map(str, interrupted)))
    for number, entry in sorted(charge.charged.items()) if charge is not None else ():
        log_event("round_charged", logging.WARNING, round=number, epsilon=f"{entry.epsilon:.4g}",
                  cumulative_epsilon=f"{entry.cumulative_epsilon:.4g}",
                  why="its coordinator died after asking for unmasking: the sum may have been released (D94)")
    paused = await asyncio.to_thread(stored_pause, store)
    if paused:
        log_event("paused", logging.WARNING, operator="(audit log)", why="an operator's pause holds across restarts")
    return paused
