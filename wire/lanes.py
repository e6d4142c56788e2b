"""A stream's outbox with a fast lane: small interactive messages overtake bulk ones.

Both ends of a session stream write from an `asyncio.Queue` of messages,
one `write` at a time (HTTP/2 flow control makes a write wait while the
peer drains the last). A round puts tens of large messages on that queue at
once (a client process's masked inputs, 50 x 215 KB for 50 devices of a
53,824-long model; the coordinator's relayed shares and round tasks), so a
top-k request or answer put behind them waited for all of them to be
written. `LaneQueue` keeps two FIFO lanes and always hands out the urgent
lane first.

Contract:
- `urgent(item)` (a pure function of the item, given at construction)
  picks the lane when the item is put;
- within a lane, order is kept (FIFO); an urgent item leaves before every
  bulk item still queued, whenever either was put;
- it is an `asyncio.Queue` in every other respect (unbounded; `get`,
  `get_nowait`, `put_nowait`, `qsize`, `empty` behave as documented there).

Use it only for messages whose meaning does not depend on their order
relative to the other lane: a request or answer matched by its correlation
id, never a round's stage messages (which stay in one lane, in order).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class _Lanes(Generic[T]):
    """The storage `asyncio.Queue` calls `_queue`: `popleft`, `len`, iteration."""

    def __init__(self) -> None:
        self.urgent: deque[T] = deque()
        self.bulk: deque[T] = deque()

    def __len__(self) -> int:
        return len(self.urgent) + len(self.bulk)

    def __iter__(self) -> Iterator[T]:
        """In the order they will leave (asyncio.Queue's repr lists them)."""
        yield from self.urgent
        yield from self.bulk

    def popleft(self) -> T:
        return self.urgent.popleft() if self.urgent else self.bulk.popleft()

    def __repr__(self) -> str:
        return f"<lanes urgent={len(self.urgent)} bulk={len(self.bulk)}>"


class LaneQueue(asyncio.Queue[T]):
    """An unbounded asyncio.Queue whose items for which `urgent(item)` is true leave first (module doc)."""

    def __init__(self, urgent: Callable[[T], bool]) -> None:
        self._is_urgent = urgent
        super().__init__()

    def _init(self, maxsize: int) -> None:
        self._queue: _Lanes[T] = _Lanes()

    def _put(self, item: T) -> None:
        lanes = self._queue
        (lanes.urgent if self._is_urgent(item) else lanes.bulk).append(item)

    def _get(self) -> T:
        return self._queue.popleft()


__all__ = ["LaneQueue"]
