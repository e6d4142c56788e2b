"""Share-decryption reports across rounds: who sits out, and for how long.

At the share check a device lists the peers whose relayed shares it could
not open. The coordinator cannot tell an honest report from a lie (the
pairwise key is symmetric), so within the round a report only removes the
pair (secagg/server/share_check.py). Across rounds this rule is the only
way a report can keep a device out of later rounds (decision D37):

- **What counts.** A report counts only if its reporter stayed in the
  round past the share check (a reporter the check removed, e.g. one that
  reported all its peers and so lost its own edges, counts for nothing).
  Reporters are counted by *credential* (the enrolling edge client's
  identity, `DeviceRecord.client_id`; "device:<id>" for a device enrolled
  without one): all devices of one credential are one reporter, and a
  report about a device of the reporter's own credential does not count.
- **When a quarantine starts.** A device is quarantined once, among the
  reports within the last `window` rounds *and* `window_s` seconds, at
  least `reporters` credentials reported it, in at least `rounds` distinct
  rounds; and only if `reporters` of them still have quota: each
  credential is charged for at most `quota` quarantines started within the
  last `window_s` seconds (the charged credentials are recorded). Its
  reports are then forgotten: a new quarantine needs new reports.
- **How long.** `quarantine_rounds` rounds or `quarantine_s` seconds,
  whichever ends first (round numbers stop advancing while selection waits;
  time does not).
- **Never starving.** Quarantine never shrinks the eligible set below the
  round minimum: the quarantined devices with the earliest expiry are
  released first, as many as needed.

The bound: a quarantine costs `reporters` charges, so a coalition of k
credentials starts at most floor(k * quota / reporters) quarantines per
`window_s` seconds, and none when k < reporters.

Pure: a function of the stored reports and quarantines, the round number,
the time and the policy; the coordinator's ReportLedger
(coordinator/report_ledger.py) reads and writes them through the store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from coordinator.store.report_records import Quarantine, ShareReport


@dataclass(frozen=True, slots=True)
class ReportPolicy:
    """The rule's parameters (see the module doc)."""

    reporters: int = 3
    rounds: int = 2
    window: int = 20
    window_s: float = 3600.0
    quarantine_rounds: int = 10
    quarantine_s: float = 600.0
    quota: int = 2

    def __post_init__(self) -> None:
        if self.reporters < 2:
            raise ValueError("reporters must be at least 2: one report never excludes beyond its round")
        if self.rounds < 1 or self.window < self.rounds or self.quarantine_rounds < 1:
            raise ValueError("need 1 <= rounds <= window and quarantine_rounds >= 1")
        if self.window_s <= 0 or self.quarantine_s <= 0 or self.quota < 1:
            raise ValueError("need window_s > 0, quarantine_s > 0 and quota >= 1")

    def bound(self, coalition: int) -> int:
        """The most quarantines a coalition of `coalition` credentials can
        start per `window_s` seconds (N in D37)."""
        return 0 if coalition < self.reporters else coalition * self.quota // self.reporters


def credential(device_id: int, client_id: str | None) -> str:
    """The reporter identity of a device: its enrolling client's identity."""
    return client_id if client_id else f"device:{device_id}"


def countable_reports(
    round_number: int, at: datetime, reports: Mapping[int, Iterable[int]], *,
    survivors: Iterable[int], credential_of: Callable[[int], str],
) -> list[ShareReport]:
    """The reports of one share check that count: {reporter device:
    reported devices} -> one ShareReport per (credential, reported device),
    from reporters in `survivors` (those the share check kept), about
    devices of another credential."""
    kept = frozenset(survivors)
    out: set[tuple[str, int]] = set()
    for reporter, reported in reports.items():
        if reporter not in kept:
            continue
        who = credential_of(reporter)
        out.update((who, d) for d in reported if d != reporter and credential_of(d) != who)
    return [ShareReport(round_number=round_number, at=at, reporter=who, reported=d) for who, d in sorted(out)]


def report_window(policy: ReportPolicy, round_number: int, now: datetime) -> tuple[int, datetime]:
    """(oldest round, oldest time) a report may have and still count."""
    return round_number - policy.window + 1, now - timedelta(seconds=policy.window_s)


def in_force(quarantines: Iterable[Quarantine], next_round: int, now: datetime) -> list[Quarantine]:
    """The quarantines that keep their device out of round `next_round` at `now`."""
    return [q for q in quarantines if q.released_at is None and next_round < q.until_round and now < q.until]


@dataclass(frozen=True, slots=True)
class QuotaRefusal:
    """A device reported by enough credentials in enough rounds whose
    quarantine the quota refused: fewer than `reporters` of its reporters
    have quota left."""

    device_id: int
    reporters: tuple[str, ...]  # the credentials whose counted reports are in the window
    with_quota: tuple[str, ...]  # those of them with quota left


@dataclass(frozen=True, slots=True)
class QuarantineDecision:
    started: list[Quarantine]
    refused: list[QuotaRefusal]


def start_quarantines(
    policy: ReportPolicy, reports: Sequence[ShareReport], quarantines: Sequence[Quarantine],
    round_number: int, now: datetime,
) -> list[Quarantine]:
    """The quarantines the stored `reports` start after round
    `round_number` (ids 0; the store assigns them), given the stored
    `quarantines` (for the quota and the ones already in force)."""
    return decide_quarantines(policy, reports, quarantines, round_number, now).started


def decide_quarantines(
    policy: ReportPolicy, reports: Sequence[ShareReport], quarantines: Sequence[Quarantine],
    round_number: int, now: datetime,
) -> QuarantineDecision:
    """`start_quarantines`, and the devices whose reports met the reporter
    and round counts but whose quarantine the credentials' quota refused
    (the coordinator logs each refusal)."""
    oldest_round, oldest_at = report_window(policy, round_number, now)
    charge_since = now - timedelta(seconds=policy.window_s)
    charges: dict[str, int] = {}
    for q in quarantines:
        if q.started_at >= charge_since:
            for c in q.charged:
                charges[c] = charges.get(c, 0) + 1
    busy = {q.device_id for q in in_force(quarantines, round_number + 1, now)}
    by_device: dict[int, list[ShareReport]] = {}
    for r in reports:
        if r.round_number >= oldest_round and r.at >= oldest_at and r.reported not in busy:
            by_device.setdefault(r.reported, []).append(r)
    started: list[Quarantine] = []
    refused: list[QuotaRefusal] = []
    for device, recent in sorted(by_device.items()):
        if len({r.round_number for r in recent}) < policy.rounds:
            continue
        reporters = sorted({r.reporter for r in recent})
        able = sorted((c for c in reporters if charges.get(c, 0) < policy.quota),
                      key=lambda c: (charges.get(c, 0), c))
        if len(able) < policy.reporters:
            if len(reporters) >= policy.reporters:
                refused.append(QuotaRefusal(device, tuple(reporters), tuple(sorted(able))))
            continue
        charged = tuple(sorted(able[: policy.reporters]))
        for c in charged:
            charges[c] = charges.get(c, 0) + 1
        started.append(Quarantine(
            device_id=device, started_round=round_number, started_at=now,
            until_round=round_number + 1 + policy.quarantine_rounds,
            until=now + timedelta(seconds=policy.quarantine_s), charged=charged,
        ))
    return QuarantineDecision(started, refused)


def releases_for_minimum(active: Iterable[Quarantine], eligible: Iterable[int], minimum: int) -> list[Quarantine]:
    """The quarantines to release so that the devices otherwise eligible
    (`eligible`, quarantine not applied) leave at least `minimum` selectable:
    earliest expiry first (time, then round, then id); [] when none is
    needed."""
    candidates = frozenset(eligible)
    held = sorted((q for q in active if q.device_id in candidates), key=lambda q: (q.until, q.until_round, q.id))
    free = len(candidates) - len({q.device_id for q in held})
    need = minimum - free
    if need <= 0:
        return []
    out: list[Quarantine] = []
    released: set[int] = set()
    for q in held:
        if len(released) >= need:
            break
        out.append(q)
        released.add(q.device_id)
    return out


def forgettable(policy: ReportPolicy, quarantines: Iterable[Quarantine], round_number: int,
                now: datetime) -> list[int]:
    """Ids of the quarantines neither in force nor charging any quota any
    more (the store may delete them)."""
    live = {q.id for q in in_force(quarantines, round_number + 1, now)}
    charge_since = now - timedelta(seconds=policy.window_s)
    return sorted(q.id for q in quarantines if q.id not in live and q.started_at < charge_since)
