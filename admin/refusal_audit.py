"""Operator actions refused at the REST layer go to the audit log (D82).

A token whose role may not use an operator route (a viewer's POST
/v1/federation/pause) is answered 403 at once; the refusal is then sent to
the coordinator (`RecordRefusal`), which appends it to the audit log as the
refusals it makes itself, with the token's name as the operator. The
sending runs in the background, so the 403 never waits for it, and it is
bounded: at most `per_minute` records per token (a token bucket of as many),
the refusals beyond it counted into that token's next record
(`suppressed`). A record the coordinator does not take (it is down) is
logged and dropped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from admin.auth import Principal

_log = logging.getLogger("fedmask.admin")

#: Sends one record: (operator, action, reason, role, suppressed) -> the audit entry's id.
Recorder = Callable[[str, str, str, str, int], Awaitable[int]]


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float
    suppressed: int = 0


class RefusalAudit:
    def __init__(self, record: Recorder, *, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        if per_minute < 1:
            raise ValueError("per_minute must be >= 1")
        self._record = record
        self._capacity = float(per_minute)
        self._rate = per_minute / 60.0
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._pending: set[asyncio.Task[None]] = set()

    def take(self, name: str) -> int | None:
        """Whether a refusal of token `name` is recorded now: the number of
        its refusals left out since its last record, or None (left out)."""
        now = self._clock()
        b = self._buckets.setdefault(name, _Bucket(self._capacity, now))
        b.tokens = min(self._capacity, b.tokens + (now - b.at) * self._rate)
        b.at = now
        if b.tokens < 1.0:
            b.suppressed += 1
            return None
        b.tokens -= 1.0
        left_out, b.suppressed = b.suppressed, 0
        return left_out

    def refused(self, who: Principal, action: str, reason: str) -> None:
        """Record (in the background, within the bound) that `who` was refused `action`."""
        left_out = self.take(who.name)
        if left_out is None:
            return
        task = asyncio.get_running_loop().create_task(self._send(who, action, reason, left_out))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _send(self, who: Principal, action: str, reason: str, left_out: int) -> None:
        try:
            await self._record(who.name, action, reason, who.role.value, left_out)
        except Exception as exc:  # noqa: BLE001 - the coordinator is down or refused it: say so, go on
            _log.warning("could not audit the refused %s of %s: %s", action, who.name, exc)

    async def drain(self) -> None:
        """Wait for the records in flight (shutdown, tests)."""
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)


__all__ = ["RefusalAudit", "Recorder"]
