"""Open streams end when the bearer token they were opened with is withdrawn
(D30, D82).

A token of a token file (auth.token_file on the device listener,
admin.token_file on the admin listener) is checked when a call starts; a
stream stays open after that. So the servicers check each long-lived
stream's call metadata again, every `recheck_interval_s` (half a heartbeat
interval), against the tokens accepted now; the token files are re-read at
most every `token_file_interval_s` (a quarter of one, at most 1 s). A token
removed from its file therefore ends every stream opened with it within one
heartbeat interval: a device Session stream with UNAUTHENTICATED (its
devices leave the connected set, so no round selects them), a WatchEvents
stream too. Fixed credentials (a single configured token, certificates) are
not watched: nothing can withdraw them while the coordinator runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

#: A listener's check of a call's invocation metadata: is its credential accepted now?
CredentialCheck = Callable[[Any], bool]

#: The `why` of the log line and the status detail of a stream ended this way.
WITHDRAWN = "bearer token withdrawn from the token file"
WITHDRAWN_DETAIL = "the bearer token this stream was opened with is no longer accepted"


def recheck_interval_s(heartbeat_interval_s: float) -> float:
    """How often an open stream's credential is checked again."""
    return heartbeat_interval_s / 2


def token_file_interval_s(heartbeat_interval_s: float) -> float:
    """How often a token file is checked for a change, at most."""
    return min(1.0, heartbeat_interval_s / 4)


async def end_when_withdrawn(accepts: CredentialCheck, metadata: Any, period_s: float,
                             on_withdrawn: Callable[[], None]) -> None:
    """Every `period_s`, check `metadata` with `accepts`; the first time it
    fails, call `on_withdrawn` and return. Cancel it when the stream ends."""
    while True:
        await asyncio.sleep(period_s)
        if not accepts(metadata):
            on_withdrawn()
            return


__all__ = ["WITHDRAWN", "WITHDRAWN_DETAIL", "CredentialCheck", "end_when_withdrawn", "recheck_interval_s",
           "token_file_interval_s"]
