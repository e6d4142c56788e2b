"""Who may hold the /v1/events streams of one admin-service process (pure;
settings `event_streams`, D82).

Every stream holds a WatchEvents watcher at the coordinator, whose number is
bounded (admin.max_watchers), so the streams are shared out here, before one
is opened:

- at most `max_streams` at once;
- at most `per_token` per token (settings entry, by name): one token cannot
  take them all, whoever holds it;
- non-operator tokens together at most `max_streams - operator_reserved`:
  however many viewers watch, operators find `operator_reserved` slots.

`acquire` answers a `Slot` (give it back with `release`, which may be
called more than once) or a `SlotRefusal`: `per_token` is a 429 (this token
holds its share; others may still watch), `full` a 503 (no slot for this
role now).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from admin.auth import Principal
from admin.settings import EventStreamSlots, Role


@dataclass(frozen=True, slots=True)
class SlotRefusal:
    status: int  # 429 (this token's share) or 503 (no slot for its role)
    detail: str


@dataclass(eq=False, slots=True)
class Slot:
    """One held stream slot."""

    owner: str
    #: held by a token that is not an operator's
    other: bool
    _pool: StreamSlots
    _released: bool = field(default=False)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._pool._give_back(self.owner, self.other)


class StreamSlots:
    """See the module doc. Single-threaded (the event loop's)."""

    def __init__(self, config: EventStreamSlots) -> None:
        self.config = config
        self.open = 0
        #: streams held by tokens that are not an operator's
        self.open_to_others = 0
        self._held: dict[str, int] = {}

    def held_by(self, name: str) -> int:
        return self._held.get(name, 0)

    def acquire(self, who: Principal) -> Slot | SlotRefusal:
        c = self.config
        if self.held_by(who.name) >= c.per_token:
            return SlotRefusal(429, f"this token holds {c.per_token} event streams already "
                                    "(event_streams.per_token); close one first")
        operator = who.role is Role.OPERATOR
        if self.open >= c.max_streams:
            return SlotRefusal(503, f"all {c.max_streams} event streams are open; retry later")
        others_room = c.max_streams - c.operator_reserved
        if not operator and self.open_to_others >= others_room:
            return SlotRefusal(503, f"the {others_room} event streams open to this role are taken (the other "
                                    f"{c.operator_reserved} are reserved for operators); retry later")
        self.open += 1
        self.open_to_others += 0 if operator else 1
        self._held[who.name] = self.held_by(who.name) + 1
        return Slot(who.name, not operator, self)

    def _give_back(self, name: str, other: bool) -> None:
        self.open -= 1
        self.open_to_others -= 1 if other else 0
        left = self._held[name] - 1
        if left:
            self._held[name] = left
        else:
            del self._held[name]


__all__ = ["Slot", "SlotRefusal", "StreamSlots"]
