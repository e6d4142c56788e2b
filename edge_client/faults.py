"""Fault injection for tests and demos (`--drop-rate/--drop-stage`,
`--crash-after-round`, `--delay-ms`).

- Dropping: each device selected for a round drops, with probability
  `drop_rate`, at `drop_stage`: it does everything before that stage and then
  stops answering for the rest of the round (no message at all, exactly like
  a phone that lost its network; the process and its stream stay up, and its
  other devices carry on). `advertise-keys` means silent from the RoundTask
  on (the device does not even train); `share-keys`, `masked-input`,
  `consistency-check`, `unmasking`: the device receives the server's request
  for that stage and never answers it. The draw is a pure function of (seed,
  round number, device id), so a run is reproducible and the same device
  does not always drop.
- Crashing: after round `crash_after_round` has ended for this process (and
  its private state is committed), the process exits with `os._exit(CRASH_EXIT_CODE)`:
  no cleanup, no goodbye on the stream, as if killed.
- Delaying: `delay_ms` before every stage reply (AdvertiseKeys, ShareKeys,
  MaskedInput, ConsistencyCheck, UnmaskingResponse).
- Garbage metrics (`--fault-garbage-metrics`, a hostile device): every
  device of the process puts 2^32 - 1 in each of its metric coordinates
  instead of its limbs (D35); its update is left as it is.
- Forged metrics (`--fault-forged-metric NAME=VALUE`, a hostile device
  that writes its metric coordinates itself): every device of the process
  puts VALUE in the slot NAME (`wire.round_metrics.SLOTS`) instead of its
  own value, NOT clamped to the slot's per-device bound: in the slot's
  units, split into its limbs least significant first, what does not fit
  left in the top limb (mod 2^32). Its other slots and its update are its
  own. It shows what the coordinator can and cannot tell from the totals
  (D35).
- Garbage shares (`--fault-garbage-shares`, a hostile device): every
  device of the process replaces the sealed shares of its ShareKeys with
  random bytes of the same length, so no peer can open them (D37).
- False reports (`--fault-false-reports`, a hostile device that follows the
  protocol otherwise): every device of the process names every sender whose
  shares were relayed to it in its ShareReceipt, as if none opened (D37).
- False reports about a few (`--fault-false-reports-about IDS`, a hostile
  device that accuses only the named devices): every device of the process
  adds the relayed senders whose enrolled device id is in IDS to the
  senders its ShareReceipt names (its honest reports stay). It keeps its
  other edges, so it stays in the round and its reports count: the case
  the per-credential quota of D37 bounds.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from typing import Any
from dataclasses import dataclass

import numpy as np

from secagg.messages import ShareReceipt, ShareRelay
from secagg.stages import Stage
from wire.round_metrics import SLOTS, MetricLayout

# CLI names of the stages a device can drop at, in protocol order.
DROP_STAGES: dict[str, Stage] = {s.cli_name: s for s in Stage}
CRASH_EXIT_CODE = 75


@dataclass(frozen=True)
class FaultPlan:
    drop_rate: float = 0.0
    drop_stage: str | None = None  # a key of DROP_STAGES
    seed: int = 0
    crash_after_round: int | None = None
    delay_ms: float = 0.0
    garbage_metrics: bool = False
    #: (slot name, value) pairs of forged metrics (see the module doc).
    forged_metrics: tuple[tuple[str, float], ...] = ()
    garbage_shares: bool = False
    false_reports: bool = False
    #: device ids every device of the process falsely reports (see the module doc)
    false_reports_about: frozenset[int] = frozenset()
    exit: Callable[[int], None] = os._exit

    def __post_init__(self) -> None:
        if not 0.0 <= self.drop_rate <= 1.0:
            raise ValueError(f"--drop-rate must be in [0, 1], got {self.drop_rate}")
        if self.drop_rate > 0 and self.drop_stage is None:
            raise ValueError("--drop-rate needs --drop-stage (" + ", ".join(DROP_STAGES) + ")")
        if self.drop_stage is not None and self.drop_stage not in DROP_STAGES:
            raise ValueError(f"unknown --drop-stage {self.drop_stage!r}; one of {', '.join(DROP_STAGES)}")
        if self.delay_ms < 0:
            raise ValueError("--delay-ms must be >= 0")
        if self.crash_after_round is not None and self.crash_after_round < 0:
            raise ValueError("--crash-after-round must be >= 0")
        for name, value in self.forged_metrics:
            if name not in SLOTS:
                raise ValueError(f"--fault-forged-metric: unknown metric {name[:64]!r}; one of {', '.join(SLOTS)}")
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"--fault-forged-metric {name}: the value must be a finite number >= 0")

    def drop_stage_of(self, device_id: int, round_number: int) -> Stage | None:
        """The stage at which this device goes silent this round, or None."""
        if self.drop_rate <= 0 or self.drop_stage is None:
            return None
        u = np.random.default_rng([int(self.seed) & 0xFFFFFFFF, int(round_number), int(device_id), 0xD20]).random()
        return DROP_STAGES[self.drop_stage] if u < self.drop_rate else None

    @property
    def delay_s(self) -> float:
        return self.delay_ms / 1000.0

    def should_crash_after(self, round_number: int) -> bool:
        return self.crash_after_round is not None and round_number >= self.crash_after_round

    def falsify_receipts(self, relay: object, replies: list[Any],
                         device_of: Callable[[int], int] | None = None) -> list[Any]:
        """With `false_reports`: each ShareReceipt of `replies` (the answer to
        the ShareRelay `relay`) names every relayed sender; with
        `false_reports_about`: it also names the relayed senders whose device
        id (`device_of` their secagg id) is in that set; else `replies`."""
        if not (self.false_reports or self.false_reports_about) or not isinstance(relay, ShareRelay):
            return replies
        relayed = [u for u, _ in relay.shares]
        if self.false_reports:
            accused = set(relayed)
        else:
            of = device_of if device_of is not None else (lambda u: u)
            accused = {u for u in relayed if of(u) in self.false_reports_about}
        return [dataclasses.replace(m, undecryptable=tuple(sorted(accused | set(m.undecryptable))))
                if isinstance(m, ShareReceipt) else m for m in replies]

    def crash(self) -> None:
        """Exit abruptly (os._exit: no finally blocks, no atexit, no stream close)."""
        self.exit(CRASH_EXIT_CODE)


def forged_metric_limbs(layout: MetricLayout, own: np.ndarray, forged: Mapping[str, float]) -> np.ndarray:
    """A hostile device's metric coordinates (uint32): `own` (its honest
    limbs, `layout.encode` of its values) with each slot named in `forged`
    holding that value instead, unclamped (see the module doc)."""
    out = np.array(own, dtype=np.uint32, copy=True)
    if layout.integers is None:
        return out
    integers = layout.integers
    i = 0
    for name in layout.names:
        slot = SLOTS[name]
        n = integers.limbs(slot.bound)
        if name in forged:
            units = int(round(forged[name] / slot.unit))
            for j in range(n):
                last = j == n - 1
                out[i + j] = (units if last else units & integers.limb_max) % (1 << 32)
                units >>= integers.limb_bits
        i += n
    return out
