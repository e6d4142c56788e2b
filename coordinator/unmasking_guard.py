"""The round record is saved before anyone is asked to unmask (D94).

A device spends its contribution to a training key when it answers an
unmasking request (D85). Whoever leads after this coordinator learns who
may have spent it only from the round's record in the store: the survivors
of the stage whose survivors get the requests (masked_input; the
consistency check in active mode; `spent_devices.unmasking_responders`).
So the stage change that opens UNMASKING is held until that record is
saved: `opens_unmasking(actions)` tells the round loop that the actions of
a stage close carry the unmasking requests, and `save_then_ask` writes the
record (the save is the caller's: a round's record, or a replica's groups
in the store, group by group) and only then delivers them. A coordinator killed at any point after
that leaves a record that counts every device asked; one killed before
leaves devices that were asked nothing.

When the save fails no request goes out: the actions are delivered without
the unmasking requests (abort notices and log lines still go), and the
error is raised for the round loop to cancel the round, which then spent
nobody.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence

from coordinator.rounds import Action, Broadcast, PhaseChanged, Send
from coordinator.store import RoundState

#: The ServerMessage field of an unmasking request (wire.secagg_codec.SERVER_FIELDS).
UNMASKING_REQUEST = "unmasking_request"


def opens_unmasking(actions: Iterable[Action]) -> bool:
    """Whether these actions open the unmasking stage (and so carry its requests)."""
    return any(isinstance(a, PhaseChanged) and a.phase is RoundState.UNMASKING for a in actions)


def _asks_to_unmask(a: Action) -> bool:
    return isinstance(a, Send | Broadcast) and a.message.WhichOneof("message") == UNMASKING_REQUEST


def without_requests(actions: Iterable[Action]) -> list[Action]:
    """`actions` less every unmasking request."""
    return [a for a in actions if not _asks_to_unmask(a)]


async def save_then_ask(save: Callable[[], object], actions: Sequence[Action],
                        apply: Callable[[Iterable[Action]], None]) -> None:
    """Run `save` (blocking, in a worker thread: it records who is asked,
    e.g. `store.save_round_progress` of the round now in UNMASKING, or a
    replica's `save_group_progress` of its groups in `unmasking`), then
    `apply(actions)`. If the save raises, apply the actions without the
    unmasking requests and re-raise."""
    try:
        await asyncio.to_thread(save)
    except BaseException:
        apply(without_requests(actions))
        raise
    apply(actions)


__all__ = ["UNMASKING_REQUEST", "opens_unmasking", "save_then_ask", "without_requests"]
