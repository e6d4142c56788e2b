"""`fedmask bench scale --kill leader|replica --at-stage STAGE`: kill -9 one
replica of the tier while a round is in STAGE, and judge what follows.

Contract:
- `KillPlan(target, stage, round_number)`: in round `round_number` (2 by
  default, so a version was committed before), once the leader's log says
  the stage opened (`event=stage_opened round=N stage=S`), the bench sends
  SIGKILL to the leader (`leader`) or to a standby (`replica`: the last
  replica started). A thread of its own reads the log every 20 ms
  (`Kill.watch`), so a stage shorter than that may be seen late:
  `Kill.stage_seen` is the stage that was open when the bench looked, which
  the result reports.
- After killing the leader, a standby must log `leader_elected`;
  `takeover_s` runs from the kill to the bench seeing that line, and the
  result's `takeover_ok` holds it to the lease time plus 5 s.
- `version_history(url)` checks the store: every committed round produced
  exactly one model version, in round order, each round starting from the
  version the previous committed round produced (no gap, no duplicate).

With the current design (D90) a standby holds no device stream, so killing
one costs the round nothing; killing the leader loses its round in flight
(the successor aborts it as `coordinator_restart`) and the devices
reconnect to the next address in their list.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from fedmask.bench.processes import Child

#: A new leader is due within the lease time plus this many seconds.
TAKEOVER_SLACK_S = 5.0
_POLL_S = 0.02


@dataclass(frozen=True)
class KillPlan:
    target: Literal["leader", "replica"]
    #: The stage's log name (advertise_keys, share_keys, share_check, masked_input, unmasking).
    stage: str
    round_number: int = 2


@dataclass
class Kill:
    """A plan being carried out against a tier (`tier[0]` leads at the start)."""

    plan: KillPlan
    tier: list[Child]
    lease_s: float
    #: Set by `poll` when it kills: whom, when (monotonic), and the stage then open ("" before).
    victim: Child | None = None
    killed_at: float | None = None
    stage_seen: str = ""
    #: After a leader kill: the standby that took the lease ("" before), and how long after the kill.
    new_leader: str = ""
    takeover_s: float | None = None

    @property
    def done(self) -> bool:
        """The kill happened and, for the leader, a successor leads."""
        return self.killed_at is not None and (self.plan.target == "replica" or bool(self.new_leader))

    def poll(self, log: Any) -> None:
        """Kill when the leader's log shows the planned round in the planned stage; then watch for a successor."""
        if self.killed_at is None:
            leader = self.tier[0]
            opened = re.findall(rf"event=stage_opened round={self.plan.round_number} stage=(\w+)", leader.log())
            if self.plan.stage not in opened:
                return
            self.stage_seen = opened[-1]
            self.victim = leader if self.plan.target == "leader" else self.tier[-1]
            self.victim.signal_group(signal.SIGKILL)
            self.killed_at = time.monotonic()
            log(f"  kill -9 {self.victim.name} (pid {self.victim.pid}, the {self.plan.target}) in round "
                f"{self.plan.round_number} at {self.stage_seen}")
            return
        if self.plan.target == "leader" and not self.new_leader:
            for c in self.tier[1:]:
                if "event=leader_elected" in c.log():
                    self.new_leader, self.takeover_s = c.name, time.monotonic() - self.killed_at
                    log(f"  {c.name} took the lease {self.takeover_s:.1f} s after the kill")

    @contextmanager
    def watch(self, log: Any) -> Iterator[Kill]:
        """`poll` every 20 ms on a thread until the kill is done or the context ends."""
        stop = threading.Event()

        def loop() -> None:
            while not self.done and not stop.wait(_POLL_S):
                self.poll(log)

        thread = threading.Thread(target=loop, name="fedmask-bench-kill", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join(5)

    def killed(self, child: Child) -> bool:
        return self.victim is child

    def figures(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "target": self.plan.target, "replica": self.victim.name if self.victim else None,
            "round": self.plan.round_number, "at_stage": self.plan.stage, "stage_seen": self.stage_seen or None,
        }
        if self.plan.target == "leader":
            out |= {"new_leader": self.new_leader or None,
                    "takeover_s": None if self.takeover_s is None else round(self.takeover_s, 2),
                    "takeover_limit_s": self.lease_s + TAKEOVER_SLACK_S,
                    "takeover_ok": self.takeover_s is not None and self.takeover_s <= self.lease_s + TAKEOVER_SLACK_S}
        return out


def version_history(url: str, committed: list[Any]) -> bool:
    """No gap, no duplicate: one version per committed round, in order, each round on the one before.
    Versions of rounds after the last of `committed` are not judged: a successor may commit another round
    between the bench's last read and the replicas' stop."""
    from coordinator.store import open_store

    store = open_store(url, migrate=False)
    try:
        versions = sorted(store.list_model_versions(limit=1000).items, key=lambda v: v.id)
    finally:
        store.close()
    last = max((r.number for r in committed), default=0)
    produced = [v.round_number for v in versions if v.round_number is not None and v.round_number <= last]
    if produced != [r.number for r in committed]:
        return False
    by_round = {v.round_number: v.id for v in versions}
    previous = versions[0].id if versions else None
    for r in committed:
        if r.base_model_version != previous:
            return False
        previous = by_round[r.number]
    return True


__all__ = ["Kill", "KillPlan", "TAKEOVER_SLACK_S", "version_history"]
