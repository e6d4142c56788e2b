"""A replica's membership of the coordinator tier: join it, keep the term
alive, say at once when it is lost, and leave it on a clean shutdown.

`MembershipKeeper` keeps the replica's membership row
(`store.join_tier` / `store.leave_tier`, coordinator/store/replica_interface.py)
by the rule of the leader lease (`LeaseKeeper`, D90): a join, a renewal
every third of the term on a thread of its own, the term counted lost
SAFETY of the way through without a renewal, a renewal that finds a new
term (the old one expired) or a term it did not start (another process
joined under this replica's name) reported as a loss. It is the
LeaseKeeper itself, given the join and the leave as its lease calls: the
join of a running term must name that term (`renewing=`), so the adapter
passes the last term the store granted. After a loss the replica must
stop serving devices (NOT_SERVING, exit code 3, as a deposed leader does,
D90); `member()` keeps returning the last term, whose writes the store
refuses (FencedOut).

`settings_digest(settings)` names the round-relevant settings (the
model and its hyper-parameters, the cohort, the deadlines, secure
aggregation with its group size, differential privacy, hybrid rounds,
round metrics, plaintext debug rounds): two replicas have the same digest
exactly when those agree. Process-local settings (listeners, TLS, auth,
limits, admin, metrics, the replica's own name, log-level-like debug
output) do not enter it.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coordinator.leadership import LeaseKeeper, LeaseLabels
from coordinator.settings import CoordinatorSettings
from coordinator.store import Lease, Store

#: The settings that decide how a round runs (dotted paths into
#: CoordinatorSettings): they enter the digest.
ROUND_SETTINGS = ("model", "cohort", "deadlines", "secagg", "dp", "hybrid", "round_metrics",
                  "debug.insecure_plaintext")
#: Every other setting: each replica's own, kept out of the digest. Every
#: field of CoordinatorSettings is in exactly one of the two (tested), so a
#: new setting has to be placed.
LOCAL_SETTINGS = ("listen_address", "database_url", "tls", "auth", "limits", "admin", "metrics", "replica",
                  "rounds", "seed", "heartbeat_interval", "max_receive_message_bytes", "health_listen_address",
                  "database_wait_s", "debug.record_sums", "debug.sum_coordinates")

MEMBER_LABELS = LeaseLabels(lease="this replica's membership", granted="tier_joined", waiting="tier_join_waiting",
                            holder_field="term", taken="another process joined under this replica's name")


def round_settings(settings: CoordinatorSettings) -> dict[str, Any]:
    """The round-relevant settings as JSON values, by dotted path. A file
    (the device CA) counts by its content's sha256, not its path, so
    replicas that mount the same CA at different paths agree."""
    dumped = settings.model_dump(mode="json")
    out: dict[str, Any] = {}
    for path in ROUND_SETTINGS:
        value: Any = dumped
        for part in path.split("."):
            value = value[part]
        out[path] = value
    ca = settings.secagg.device_ca
    if ca is not None:
        out["secagg"]["device_ca"] = "sha256:" + hashlib.sha256(Path(ca).read_bytes()).hexdigest()
    return out


def settings_digest(settings: CoordinatorSettings) -> str:
    """Hex sha256 of `round_settings` in canonical JSON (keys sorted, no
    spaces): equal for equal round-relevant settings, whatever their
    order in a file, different when any of them differs."""
    canonical = json.dumps(round_settings(settings), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


class MembershipKeeper:
    """Keeps one replica's membership term (see the module doc)."""

    def __init__(self, store: Store, replica: str, lease_s: float, *, settings_digest: str,
                 device_address: str | None = None, admin_address: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._digest, self._device_address, self._admin_address = settings_digest, device_address, admin_address
        self._granted: Lease | None = None  # the last term the store granted or renewed
        self._keeper = LeaseKeeper(store, replica, lease_s, clock=clock, acquire_lease=self._join,
                                   release_lease=store.leave_tier, holder_of=self._running_term,
                                   labels=MEMBER_LABELS)

    @property
    def replica(self) -> str:
        return self._keeper.holder

    @property
    def lease_s(self) -> float:
        return self._keeper.lease_s

    def _join(self, replica: str, seconds: float) -> Lease | None:
        """The keeper's `acquire_lease`: a join that renews the last term
        granted (None before the first), so the store keeps that term's
        token while it runs, starts a new term when it expired, and refuses
        (None) while a term this keeper was not granted runs."""
        lease = self._store.join_tier(replica, seconds, settings_digest=self._digest,
                                      device_address=self._device_address, admin_address=self._admin_address,
                                      renewing=self._granted)
        if lease is not None:
            self._granted = lease
        return lease

    def _running_term(self) -> str | None:
        for record in self._store.live_replicas():
            if record.name == self.replica:
                return f"term {record.token} of {record.name}, not this process's"
        return None

    async def join(self, *, wait_s: float | None = None, poll_s: float | None = None) -> Lease:
        """Join the tier; while a term of this name that this keeper did not
        start runs (a crashed predecessor with the same replica id), wait
        for it to expire, at most `wait_s` (then LeaseHeld)."""
        return await self._keeper.acquire(wait_s=wait_s, poll_s=poll_s)

    def member(self) -> Lease:
        """The term this replica holds, or held last (the fence of its
        stream publishes). RuntimeError before the first join."""
        return self._keeper.fence()

    def keep(self, stop: threading.Event) -> str | None:
        """Renew until the term is lost (returns why) or `stop` is set
        (None). Blocking: see `keep_in_background`."""
        return self._keeper.keep(stop)

    def keep_in_background(self, on_lost: Callable[[str], None]) -> Callable[[], None]:
        """Renew on a daemon thread; `on_lost(reason)` is called from that
        thread when the term is lost. Returns the function that stops it."""
        return self._keeper.keep_in_background(on_lost)

    async def leave(self) -> None:
        """End the term now (a clean shutdown): the store deletes its stream
        rows, and the next join starts a new term."""
        await self._keeper.release()


__all__ = ["LOCAL_SETTINGS", "ROUND_SETTINGS", "MembershipKeeper", "round_settings", "settings_digest"]
