"""History read from the coordinator's store (read only) and shaped into the
API's bodies.

Blocking (the SQL store blocks): the routes call these from a worker thread.
Only the store's read methods are called. Listings page with opaque cursors
(`encode_cursor` / `decode_cursor`): a letter naming the listing and the
exclusive upper bound of the next page in hex. The OpenAPI document gives
their pattern, so a fuzzer's schema-valid cursor is a valid one; anything
else, or another listing's cursor, is a `BadCursor` (422).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from admin import schemas
from dpmech import PROTECTS
from coordinator.store import (
    ModelVersionSummary,
    NotFoundError,
    PrivacyEntry,
    RoundRecord,
    RoundState,
    Store,
)

#: Store pages read per request when filtering rounds by outcome: a rare
#: outcome gives a short page (with a cursor to go on), never a scan of the
#: whole history in one request.
MAX_SCAN_PAGES = 20
#: Lineage shown per model version.
MAX_LINEAGE = 50
#: The order a round record's stages are shown in: its selection and
#: training, then the stages it ran (secagg's, then aggregating).
STAGE_ORDER: tuple[str, ...] = ("selected", "training", *schemas.ROUND_STAGES)
_PREFIX = {"rounds": "R", "models": "M", "audit": "A"}


class BadCursor(ValueError):
    """A cursor this service did not make (or made for another listing)."""


def cursor_pattern(kind: str) -> str:
    """The regular expression every cursor of `kind` matches (and every
    string matching it is a valid cursor: the API documents it)."""
    return f"^{_PREFIX[kind]}[1-9a-f][0-9a-f]{{0,14}}$"


def encode_cursor(kind: str, before: int) -> str:
    if not 1 <= before < 16**15:
        raise ValueError(f"cursor bound out of range: {before}")
    return f"{_PREFIX[kind]}{before:x}"


def decode_cursor(kind: str, cursor: str | None) -> int | None:
    """The exclusive bound a cursor of `kind` holds (None: from the newest)."""
    if cursor is None:
        return None
    if re.fullmatch(cursor_pattern(kind), cursor) is None:
        raise BadCursor(f"the cursor is not one this API returned for this listing (a {kind} cursor matches "
                        f"{cursor_pattern(kind)})")
    return int(cursor[1:], 16)


def outcome_of(state: RoundState) -> schemas.Outcome:
    if state is RoundState.COMMITTED:
        return "committed"
    if state is RoundState.ABORTED:
        return "aborted"
    return "running"


@dataclass(frozen=True)
class Ledger:
    """The privacy ledger by round."""

    entries: Mapping[int, PrivacyEntry]

    @classmethod
    def read(cls, store: Store) -> Ledger:
        return cls({e.round_number: e for e in store.privacy_ledger()})


def _versions(store: Store) -> Iterator[ModelVersionSummary]:
    """Every model version, newest first, page by page."""
    before: int | None = None
    while True:
        page = store.list_model_versions(limit=200, before=before)
        yield from page.items
        if page.next_cursor is None:
            return
        before = page.next_cursor


def versions_by_round(store: Store, oldest_round: int) -> dict[int, int]:
    """round number -> the model version it produced, for rounds >= oldest_round
    (versions are newest first and rounds commit in order, so the scan stops
    at the first older one)."""
    out: dict[int, int] = {}
    for v in _versions(store):
        if v.round_number is not None:
            if v.round_number < oldest_round:
                break
            out[v.round_number] = v.id
    return out


#: A FedMMF hybrid round's survivors key of the devices whose UNPROTECTED
#: plaintext update was counted (coordinator/hybrid.py, D65): not a stage.
PLAINTEXT_PATH = "plaintext"


def _validation(metrics: Mapping[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.startswith("val_")}


def round_summary(r: RoundRecord, *, produced: int | None, ledger: Ledger) -> schemas.RoundSummary:
    entry = ledger.entries.get(r.number)
    contributors = r.metrics.get("contributors")
    return schemas.RoundSummary(
        number=r.number, state=r.state.value, outcome=outcome_of(r.state), started_at=r.started_at,
        ended_at=r.ended_at,
        seconds=(r.ended_at - r.started_at).total_seconds() if r.ended_at is not None else None,
        cohort_size=r.cohort_size, contributors=int(contributors) if contributors is not None else None,
        abort_reason=r.abort_reason, base_model_version=r.base_model_version, model_version=produced,
        epsilon=entry.cumulative_epsilon if entry is not None else None,
        delta=entry.delta if entry is not None else None, validation=_validation(r.metrics),
    )


def round_detail(r: RoundRecord, *, produced: int | None, ledger: Ledger) -> schemas.RoundDetail:
    summary = round_summary(r, produced=produced, ledger=ledger)
    names = [s for s in STAGE_ORDER if s in r.survivors or s in r.dropouts or s in r.timings]
    names += sorted((set(r.survivors) | set(r.dropouts) | set(r.timings)) - set(names) - {PLAINTEXT_PATH})
    stages = [schemas.StageReport(stage=s, survivors=len(r.survivors[s]) if s in r.survivors else None,
                                  dropouts=len(r.dropouts.get(s, ())), seconds=r.timings.get(s))
              for s in names]
    entry = ledger.entries.get(r.number)
    threshold = r.metrics.get("threshold")
    return schemas.RoundDetail(
        **summary.model_dump(), threshold=int(threshold) if threshold is not None else None, stages=stages,
        dropout_ids={k: list(v) for k, v in r.dropouts.items() if v}, metrics=dict(r.metrics),
        epsilon_round=entry.epsilon if entry is not None else None,
        noise_multiplier=entry.noise_multiplier if entry is not None else None,
        plaintext_device_ids=list(r.survivors.get(PLAINTEXT_PATH, ())),
    )


def list_rounds(store: Store, *, limit: int, cursor: str | None,
                outcome: schemas.Outcome | None) -> schemas.RoundPage:
    """Newest first, `limit` at most, optionally of one outcome."""
    before = decode_cursor("rounds", cursor)
    found: list[RoundRecord] = []
    scanned_to: int | None = None  # the oldest round looked at
    at_end = False
    for _ in range(MAX_SCAN_PAGES):
        page = store.list_rounds(limit=limit, before=before)
        for r in page.items:
            scanned_to = r.number
            if outcome is None or outcome_of(r.state) == outcome:
                found.append(r)
                if len(found) == limit:
                    break
        if len(found) == limit:
            break
        if page.next_cursor is None:
            at_end = True
            break
        before = page.next_cursor
    next_before = None if at_end or not _has_older(store, scanned_to) else scanned_to
    ledger = Ledger.read(store)
    produced = versions_by_round(store, min((r.number for r in found), default=1 << 62))
    items = [round_summary(r, produced=produced.get(r.number), ledger=ledger) for r in found]
    return schemas.RoundPage(items=items, next_cursor=encode_cursor("rounds", next_before) if next_before else None)


def _has_older(store: Store, number: int | None) -> bool:
    return number is not None and bool(store.list_rounds(limit=1, before=number).items)


def get_round(store: Store, number: int) -> schemas.RoundDetail | None:
    r = store.get_round(number)
    if r is None:
        return None
    produced = versions_by_round(store, number).get(number) if r.state is RoundState.COMMITTED else None
    return round_detail(r, produced=produced, ledger=Ledger.read(store))


class RoundCounter:
    """Rounds per outcome, read incrementally. A terminal round is never
    written again (the store's contract), so the counts of the oldest run of
    terminal rounds are kept and each call reads only the rounds newer than
    it: a derived cache of immutable rows, not state (any instance computes
    the same). Thread-safe."""

    def __init__(self, *, page: int = 500) -> None:
        self._page = page
        self._lock = threading.Lock()
        #: Every round numbered <= settled is terminal and counted in _base.
        self._settled = 0
        self._base: dict[schemas.Outcome, int] = {"committed": 0, "aborted": 0, "running": 0}

    def counts(self, store: Store) -> dict[schemas.Outcome, int]:
        with self._lock:
            newer: list[RoundRecord] = []  # newest first
            before: int | None = None
            done = False
            while not done:
                page = store.list_rounds(limit=self._page, before=before)
                for r in page.items:
                    if r.number <= self._settled:
                        done = True
                        break
                    newer.append(r)
                if page.next_cursor is None:
                    done = True
                before = page.next_cursor
            counts = dict(self._base)
            for r in newer:
                counts[outcome_of(r.state)] += 1
            for r in reversed(newer):  # oldest first: settle the run of terminal rounds
                if not r.state.is_terminal:
                    break
                self._base[outcome_of(r.state)] += 1
                self._settled = r.number
            return counts


def _parent(store: Store, v: ModelVersionSummary) -> int | None:
    """The version `v` was trained from: its round's base version; for a
    rollback, the version it restored (hyperparameters["rollback_of"])."""
    restored = v.hyperparameters.get("rollback_of")
    if isinstance(restored, int) and not isinstance(restored, bool):
        return restored
    if v.round_number is None:
        return None
    r = store.get_round(v.round_number)
    return r.base_model_version if r is not None else None


def model_summary(store: Store, v: ModelVersionSummary) -> schemas.ModelSummary:
    return schemas.ModelSummary(version=v.id, model_name=v.model_name, round_number=v.round_number,
                                parent_version=_parent(store, v), created_at=v.created_at, sha256=v.sha256,
                                size_bytes=v.size_bytes, hyperparameters=dict(v.hyperparameters))


def list_models(store: Store, *, limit: int, cursor: str | None) -> schemas.ModelPage:
    page = store.list_model_versions(limit=limit, before=decode_cursor("models", cursor))
    return schemas.ModelPage(items=[model_summary(store, v) for v in page.items],
                             next_cursor=encode_cursor("models", page.next_cursor) if page.next_cursor else None)


def get_model(store: Store, version: int, *, parameters_url: str) -> schemas.ModelDetail | None:
    try:
        v = store.get_model_version(version)
    except NotFoundError:
        return None
    summary = model_summary(store, v)
    lineage = [v.id]
    parent = summary.parent_version
    while parent is not None and len(lineage) < MAX_LINEAGE and parent not in lineage:
        lineage.append(parent)
        try:
            parent = _parent(store, store.get_model_version(parent))
        except NotFoundError:
            break
    return schemas.ModelDetail(**summary.model_dump(), lineage=lineage, parameters_url=parameters_url)


def model_parameters(store: Store, version: int) -> tuple[bytes, str] | None:
    """(the .npz blob, its sha256), checked by the store; None if unknown."""
    try:
        v = store.get_model_version(version)
    except NotFoundError:
        return None
    return v.parameters, v.sha256


@dataclass(frozen=True)
class PrivacyClaim:
    """What the product says with an epsilon: its delta, the unit it protects, and the production-size line."""

    delta: float | None
    amplified: bool
    statement: str | None
    production_plan: schemas.ProductionPlan | None


def privacy_claim(store: Store, entries: Sequence[PrivacyEntry]) -> PrivacyClaim:
    """The claim for a ledger (ascending rounds). The production-size line
    prices the latest round's multiplier with its counted devices
    (dpmech.claims, imported on first use: dp_accounting is slow to import,
    and the service starts without it)."""
    if not entries:
        return PrivacyClaim(delta=None, amplified=False, statement=None, production_plan=None)
    from dpmech import claims

    last = entries[-1]
    amplified = any(e.sampling_rate < 1 for e in entries)
    counted, _ = ledger_counted(store.get_round(last.round_number))
    line = claims.production_line(last.noise_multiplier, int(counted)) if counted else None
    return PrivacyClaim(
        delta=last.delta, amplified=amplified,
        statement=claims.statement(last.cumulative_epsilon, last.delta, len(entries), amplified=amplified),
        production_plan=schemas.ProductionPlan(**line.as_dict()) if line is not None else None)


def ledger_counted(r: RoundRecord | None) -> tuple[int | None, str]:
    """A ledger entry's counted devices and why it is in the ledger: a
    committed round's contributors; an aborted round is charged as
    released because its coordinator died after asking for unmasking (D94),
    at the devices counted at masked input (None when its record does not
    list them: it was priced at its threshold)."""
    if r is not None and r.state is RoundState.ABORTED:
        listed = r.survivors.get("masked_input")
        return (len(listed) if listed else None), schemas.INTERRUPTED_CHARGE
    counted = r.metrics.get("contributors") if r is not None else None
    return (int(counted) if counted is not None else None), schemas.COMMITTED_CHARGE


def privacy(store: Store, *, budget: float | None, exhausted: bool | None) -> schemas.Privacy:
    """The ledger, each entry with its round's counted devices, the budget, and what epsilon means."""
    entries = store.privacy_ledger()
    claim = privacy_claim(store, entries)
    unprotected = unprotected_rounds(store)
    ledger: list[schemas.LedgerEntry] = []
    for e in entries:
        r = store.get_round(e.round_number)
        counted, charged = ledger_counted(r)
        ledger.append(schemas.LedgerEntry(
            round_number=e.round_number, noise_multiplier=e.noise_multiplier, sampling_rate=e.sampling_rate,
            counted_devices=counted, epsilon_round=e.epsilon,
            epsilon_cumulative=e.cumulative_epsilon, delta=e.delta,
            unprotected_contributions=unprotected.get(e.round_number, 0), charged=charged,
            groups=[schemas.LedgerGroup(**g.as_json()) for g in e.groups]))
    spent = entries[-1].cumulative_epsilon if entries else 0.0
    return schemas.Privacy(
        rounds_accounted=len(entries), epsilon_spent=spent, delta=claim.delta, protects=PROTECTS,
        amplification_by_sampling=claim.amplified, statement=claim.statement, production_plan=claim.production_plan,
        epsilon_budget=budget, epsilon_remaining=max(budget - spent, 0.0) if budget is not None else None,
        exhausted=exhausted, ledger=ledger, unprotected_contributions_total=sum(unprotected.values()),
        unprotected_rounds=[schemas.UnprotectedRound(round_number=n, devices=d) for n, d in sorted(unprotected.items())])


#: The round metric a hybrid round records its plaintext contributions under (coordinator/round_report.py).
UNPROTECTED_METRIC = "hybrid.unprotected_contributions"


def unprotected_rounds(store: Store, *, page: int = 500) -> dict[int, int]:
    """Round number -> plaintext contributions, for every committed round that
    had any (read from the round records, so rounds without differential
    privacy count too; a scan of the history, newest first)."""
    out: dict[int, int] = {}
    before: int | None = None
    while True:
        got = store.list_rounds(limit=page, before=before)
        for r in got.items:
            n = r.metrics.get(UNPROTECTED_METRIC) if r.state is RoundState.COMMITTED else None
            if n is not None and n > 0:
                out[r.number] = int(n)
        if got.next_cursor is None:
            return out
        before = got.next_cursor


def list_audit(store: Store, *, limit: int, cursor: str | None) -> schemas.AuditPage:
    """The operator audit log, newest first."""
    page = store.list_audit(limit=limit, before=decode_cursor("audit", cursor))
    items = [schemas.AuditEntry(id=e.id, at=e.at, operator=e.operator, action=e.action, outcome=e.outcome,
                                details=dict(e.details)) for e in page.items]
    return schemas.AuditPage(items=items,
                             next_cursor=encode_cursor("audit", page.next_cursor) if page.next_cursor else None)
