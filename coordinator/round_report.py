"""What a round leaves behind: its record, its metrics and its privacy entry.

    round_record(r, state, ...)      the RoundRecord of a round machine (one instance or groups)
    round_metrics(r, ...)            the metrics stored with a committed round
    shape_metrics(r)                 cohort, threshold, neighbours (in every record)
    PrivacyLedger                    epsilon per round and composed (D12, D19, D88)

Pure apart from `PrivacyLedger`, which reads the store's ledger once (the
first time it accounts a round after a start) and keeps a running
composition that `committed` extends only after the store committed the
round.

Imports: `models.privacy` (dp_accounting and torch, ~2.3 s of start-up
measured with `python -X importtime`) and `models.evaluation` (torch, ~1.1 s)
are imported where a round first needs them, so the coordinator starts
without torch (see coordinator/model_host.py).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from coordinator.debug import debug_metrics
from coordinator.logs import log_event
from coordinator.metric_rules import metric_violation
from coordinator.model_host import SYNTHETIC
from coordinator.grouped_rounds import AnyRound, Grouped, GroupsShape
from coordinator.settings import DebugSettings, DpSettings
from coordinator.store import GroupCharge, PrivacyEntry, RoundRecord, RoundState, Store
from wire.round_metrics import MetricRangeError
from wire.secagg_codec import reason_name

if TYPE_CHECKING:
    from dpmech.mechanism import MechanismConfig
    from models.privacy import Composition


def round_record(
    r: AnyRound,
    state: RoundState,
    *,
    started_at: datetime,
    ended_at: datetime | None,
    base_model_version: int | None,
    metrics: Mapping[str, float] | None = None,
    timings: Mapping[str, float] | None = None,
) -> RoundRecord:
    """The store's record of round `r` in `state` (survivors per stage with
    the selected cohort under "selected", dropouts, timings, metrics).

    Every record, committed, aborted or in progress, carries the round's
    secure-aggregation shape among its metrics: `cohort` (devices selected),
    `threshold` (the Shamir threshold t of every neighbourhood closure; of
    the whole cohort on the complete graph) and `neighbours` (the graph
    degree k; cohort - 1 on the complete graph). What the coordinator counts
    itself, so it is never behind the secure sum."""
    aborted = state is RoundState.ABORTED and r.abort_reason is not None
    return RoundRecord(
        number=r.number,
        state=state,
        started_at=started_at,
        ended_at=ended_at,
        cohort_size=len(r.cohort),
        abort_reason=reason_name(r.abort_reason) if aborted and r.abort_reason is not None else None,
        base_model_version=base_model_version,
        survivors={"selected": list(r.cohort), **r.survivors()},
        dropouts=r.dropout_ids(),
        timings=dict(timings if timings is not None else r.timings),
        metrics={**shape_metrics(r), **path_metrics(r), **(metrics or {})},
    )


def path_metrics(r: AnyRound) -> dict[str, float]:
    """A hybrid round's paths (D64): `hybrid.plaintext_devices` (UNPROTECTED
    contributions, also `hybrid.unprotected_contributions`) and
    `hybrid.secure_devices` counted; empty for every other round."""
    from coordinator.hybrid import HybridRoundMachine

    return r.path_metrics() if isinstance(r, HybridRoundMachine) else {}


def shape_metrics(r: AnyRound) -> dict[str, float]:
    """The round's cohort size, Shamir threshold and graph degree; in a
    round in groups (D99) the smallest group's threshold, the largest
    degree, `groups` (how many) and `group_size_max` (the largest: what an
    interrupted round's charge prices the noise shares at)."""
    out = {"cohort": float(len(r.cohort)), "threshold": float(r.config.threshold),
           "neighbours": float(r.config.degree)}
    if isinstance(r.config, GroupsShape):
        out["groups"] = float(r.config.groups)
        out["group_size_max"] = float(max(r.config.sizes))
    return out


def round_metrics(r: AnyRound, *, model_name: str, debug: DebugSettings) -> dict[str, float]:
    """The metrics stored with a committed round: contributors and cohort
    (what the coordinator counts itself); the metric totals over the counted
    devices, decoded from the secure sum (`sum.<name>` for real sums,
    `count.<name>` for counts); the models' own sum -> mean rules
    (validation metrics as "val_<name>", e.g. `val_hr@10`, `val_rmse`);
    with debug.record_sums, the aggregate's checksum. Only finite values
    are kept.

    Totals that are out of range (`MetricRangeError`) or impossible by
    meaning (`metric_rules.metric_violation`) mean some device put garbage
    in its metric coordinates: none of them is kept, `metrics_unavailable`
    is 1 and the round commits all the same (its model update is separate
    coordinates of the sum, D35)."""
    result = r.result
    assert result is not None
    m = len(result.counted)
    out: dict[str, float] = {"contributors": float(m), "cohort": float(len(r.cohort))}
    try:
        sums, counts = r.metrics.decode(result.metric_sums, m)
        why = metric_violation(sums, counts, m)
    except MetricRangeError as exc:
        why = f"out of range: {exc}"
    if why is not None:
        log_event("metrics_unavailable", logging.WARNING, round=r.number, why=why)
        out["metrics_unavailable"] = 1.0
        sums, counts = {}, {}
    for k, v in sums.items():
        out[f"sum.{k}"] = v
    for k, n in counts.items():
        out[f"count.{k}"] = float(n)
    if "update_norm" in sums and counts.get("devices"):
        out["update_norm"] = sums["update_norm"] / counts["devices"]
    if model_name != SYNTHETIC and (sums or counts):
        from models.evaluation import finalize  # the models' own sum -> mean rules

        merged = {**sums, **{k: float(n) for k, n in counts.items()}}
        # devices report validation sums as "val_<name>" (e.g. val_sampled_hits@10)
        val = {k.removeprefix("val_"): v for k, v in merged.items() if k.startswith("val_")}
        out.update({f"val_{k}": v for k, v in finalize(val).items()})
    if debug.record_sums:
        out.update(debug_metrics(result.encoded_sum, result.decoded_sum, m, debug.sum_coordinates,
                                 result.unmasked_sum))
    return {k: v for k, v in out.items() if math.isfinite(v)}


class PrivacyLedger:
    """Epsilon from the mechanism's own bound, composed with dp_accounting.

    What is protected: one device, all of its data. Neighbouring inputs
    differ in one device's update replaced by zero ("zero-out"; the device
    still adds its noise share), so the guarantee bounds what the sequence
    of released sums, and the models stepped from them, reveal about
    whether and how one device took part. Each entry states epsilon at
    `delta` for that round alone and for every committed round so far.

    Every round is accounted WITHOUT amplification by sampling: q = 1 (D28).
    The coordinator's cohort is a fixed-size draw among the devices that are
    connected and eligible, and by default a device that contributed to one
    round is excluded from the next; that is neither the Poisson nor the
    independent uniform sampling the amplification theorems assume, and the
    population it is drawn from is what peers make it (enrolling idle
    devices once drove q from 0.67 to 0.0009). With q = 1 the reported
    epsilon is an upper bound whatever the selection.

    The mechanism (D88). With the discrete Gaussian (`r.mechanism`) a round
    is priced by its zCDP bound, `dpmech.mechanism.privacy_rho`: the
    sensitivity after rotation and rounding (sqrt(B), which the devices
    enforce), and the noise that reached the sum: with distributed noise
    the counted devices' shares only (dropouts cost privacy, D19), with
    local noise one device's share (its own guarantee, an upper bound for
    the sum). The entry's `noise_multiplier` is then the Gaussian
    multiplier with the same Renyi curve, z = 1 / sqrt(2 rho)
    (`dpmech.calibrate.noise_multiplier_of`), so the running composition
    (RDP, the only accountant the settings allow with it) composes it
    exactly as a ZCDpEvent. With the float Gaussian (gaussian-float) the
    round is accounted as the Gaussian mechanism at z * sqrt(counted /
    cohort) (distributed) or z (local): APPROXIMATE, since the devices'
    noise is float and the encoding rounds and clips it per coordinate.
    The cumulative epsilon composes every committed round exactly, each at
    its own (z, q), and every round charged as released because its
    coordinator died after asking for unmasking (`charge`, D94): the
    running composition is built from the store's ledger once (`reload`
    after a start-up charged rounds), and extended by `committed` only
    after the store has committed the round.

    The budget (dp.epsilon_budget, D42): `epsilon_after(cohort, counted)`
    prices one more round; the coordinator asks it with counted = the
    round's Shamir threshold (the fewest devices a committed round can
    count, so the largest epsilon it can cost) before opening a round."""

    def __init__(self, dp: DpSettings, store: Store) -> None:
        self._dp = dp
        self._store = store
        self._composition: Composition | None = None

    @property
    def enabled(self) -> bool:
        return self._dp.mode != "none" and self._dp.noise_multiplier > 0

    def entry_for(self, r: AnyRound) -> PrivacyEntry | None:
        """The ledger entry round `r` would add (None without DP). Blocking
        (reads the store the first time): call it from a worker thread."""
        if not self.enabled:
            return None
        assert r.result is not None
        if isinstance(r, Grouped):  # each released group's sum at the noise its devices split (D99)
            groups = tuple(
                GroupCharge(size=len(m.cohort), counted=len(m.result.counted),
                            noise_multiplier=self.round_multiplier(cohort=len(m.cohort), counted=len(m.result.counted),
                                                                   mechanism=m.mechanism))
                for m in r.released() if m.result is not None)
            z = min(g.noise_multiplier for g in groups)
            return self._entry(r.number, z, self._loaded().epsilon_with(z, 1.0), groups)
        z = self.round_multiplier(cohort=len(r.cohort), counted=len(r.result.counted), mechanism=r.mechanism)
        return self._entry(r.number, z, self._loaded().epsilon_with(z, 1.0))

    def charge(self, number: int, z: float, ledger: Sequence[PrivacyEntry],
               groups: tuple[GroupCharge, ...] = ()) -> PrivacyEntry | None:
        """The entry of round `number` at multiplier z (`round_multiplier`,
        as a committed round's), its cumulative epsilon composed with
        `ledger` (the entries before it, given rather than read: a store's
        charge rule runs inside its transaction, D94). None without DP.
        Pure apart from the accountant."""
        if not self.enabled:
            return None
        from models.privacy import Composition

        history = Composition([(e.noise_multiplier, e.sampling_rate) for e in ledger], delta=self._dp.delta,
                              accountant=self._dp.accountant)
        return self._entry(number, z, history.epsilon_with(z, 1.0), groups)

    def _entry(self, number: int, z: float, cumulative: float, groups: tuple[GroupCharge, ...] = ()) -> PrivacyEntry:
        """Round `number`'s entry at multiplier z, q = 1 (see the class doc)."""
        from models.privacy import composed_epsilon

        dp = self._dp
        q = 1.0  # no amplification by sampling (see the class doc)
        return PrivacyEntry(
            round_number=number, epsilon=composed_epsilon([(z, q)], delta=dp.delta, accountant=dp.accountant),
            delta=dp.delta, noise_multiplier=z, sampling_rate=q, cumulative_epsilon=cumulative, groups=groups,
        )

    def round_multiplier(self, *, cohort: int, counted: int, mechanism: MechanismConfig | None) -> float:
        """The noise multiplier a round is accounted at (see the class doc)."""
        dp = self._dp
        if mechanism is not None:
            from dpmech.calibrate import noise_multiplier_of
            from dpmech.mechanism import privacy_rho

            return noise_multiplier_of(privacy_rho(mechanism, counted if dp.mode == "distributed" else 1))
        from models.privacy import distributed_noise_multiplier

        if dp.mode == "distributed":
            return distributed_noise_multiplier(dp.noise_multiplier, planned=cohort, counted=counted)
        return dp.noise_multiplier

    def _loaded(self) -> Composition:
        """The composition of the stored ledger (read once; blocking)."""
        from models.privacy import Composition

        if self._composition is None:
            history = [(e.noise_multiplier, e.sampling_rate) for e in self._store.privacy_ledger()]
            self._composition = Composition(history, delta=self._dp.delta, accountant=self._dp.accountant)
        return self._composition

    @property
    def budget(self) -> float | None:
        return self._dp.epsilon_budget

    def spent(self) -> float:
        """Cumulative epsilon of the committed rounds (0 without DP).
        Blocking the first time (reads the store)."""
        if not self.enabled:
            return 0.0
        return self._loaded().epsilon()

    def epsilon_after(self, *, cohort: int, counted: int, mechanism: MechanismConfig | None = None) -> float:
        """The cumulative epsilon if one more round with `counted` of
        `cohort` devices in its sum were committed (the multiplier as in
        `entry_for`; `mechanism`: the round's discrete Gaussian). Blocking
        the first time."""
        if not self.enabled:
            return 0.0
        z = self.round_multiplier(cohort=cohort, counted=counted, mechanism=mechanism)
        return self._loaded().epsilon_with(z, 1.0)

    def reload(self) -> None:
        """Read the stored ledger again the next time (it changed outside
        this object: a start-up charged interrupted rounds, D94)."""
        self._composition = None

    def committed(self, entry: PrivacyEntry | None) -> None:
        """The store committed the round of `entry`: extend the composition."""
        if entry is not None and self._composition is not None:
            self._composition.add(entry.noise_multiplier, entry.sampling_rate)


__all__ = ["PrivacyLedger", "path_metrics", "round_metrics", "round_record", "shape_metrics"]
