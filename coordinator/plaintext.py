"""INSECURE plaintext aggregation rounds (benchmark baseline, loopback only).

`PlaintextRoundMachine` has the interface of `rounds.RoundMachine` but no
secure aggregation at all: every device sends its *unmasked* encoded update
in a MaskedInput message (`masked_vector` = the fixed-point encoding of its
update, no masks), and the coordinator sums what arrives. It exists only so
that `fedmask bench round` can measure what secure aggregation costs over
the same processes, transport, encoding, deadlines, store and commit path.

It is switched on by `debug.insecure_plaintext` (coordinator flag
`--debug-insecure-plaintext`), which the settings refuse unless the
coordinator listens on a loopback address; the RoundTask then carries
`"insecure_plaintext": true` in its hyper-parameters, and an edge client only
answers such a task when started with `--debug-allow-insecure-plaintext`
(otherwise it withdraws its devices). The server learns every device's
update: never use it with real data.

One stage: MASKED_INPUT opens when the RoundTasks go out; its deadline is the
training window plus the masked-input deadline. It closes when every
device answered or was dropped, or at the deadline (silent devices are
dropped with DEADLINE_MISSED, as in a secure round). With fewer than the
round's threshold t of inputs the round aborts (TOO_FEW_SURVIVORS), so
secure and plaintext rounds count the same cohorts.

No metrics: every input arrives in the clear, so a metric of one device
would too (D35). The round's record has only what the coordinator counts
itself (contributors, cohort).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from coordinator.aggregate import aggregate_result
from coordinator.rounds import (
    Action,
    AggregateReady,
    PhaseChanged,
    RoundMachine,
)
from coordinator.store import RoundState
from fedmask_proto.v1 import common_pb2, secagg_pb2
from wire import RoundIds, WireError
from wire import secagg_codec as codec
from wire.secagg_codec import reason_name

P = common_pb2


@dataclass
class PlaintextRoundMachine(RoundMachine):
    """See the module doc. `deadlines["masked_input"]` is the whole window."""

    def __post_init__(self) -> None:  # no secagg server states
        if self.metrics.coordinates:
            # every input arrives in the clear here: no metric of one device may ride along (D35)
            raise ValueError("a plaintext round carries no metric coordinates")
        self.cohort = tuple(self.cohort)
        self.ids = RoundIds.from_cohort(self.cohort)
        if len(self.cohort) != self.config.num_clients:
            raise ValueError(f"cohort of {len(self.cohort)} for a config of n={self.config.num_clients}")
        self.phase = RoundState.MASKED_INPUT
        self._stage_started = 0.0
        self._out: set[int] = set()
        self._pending: set[int] = set(self.cohort)
        self._counted: list[int] = []
        self._sum = np.zeros(self.config.vector_length, dtype=np.uint64)
        self._wire_kwargs = {
            "vector_length": self.config.vector_length,
            "modulus_bits": self.config.encoding.modulus_bits,
        }

    # ------------------------------------------------------------ properties

    @property
    def wants_close(self) -> bool:
        return self.phase.is_collecting and not self._pending

    def share_reports(self) -> dict[int, list[int]]:
        """No shares, no reports."""
        return {}

    @property
    def pending_count(self) -> int:
        return len(self._pending) if self.phase.is_collecting else 0

    def survivors(self) -> dict[str, list[int]]:
        return {RoundState.MASKED_INPUT.value: sorted(self._counted)}

    # ------------------------------------------------------------ events

    def handle(self, device_id: int, message: Any, now: float) -> list[Action]:
        screened = self._screen(device_id, message, now)
        if screened is not None:
            return screened
        kind = type(message).__name__
        if isinstance(message, P.AbortNotice):
            self._pending.discard(device_id)
            self._mark_out(device_id, f"client_abort:{reason_name(message.reason)}")
            return [self._log("device_withdrew", device=device_id, stage=self.phase.value)]
        if not isinstance(message, secagg_pb2.MaskedInput):
            return self._drop(device_id, P.ABORT_REASON_PROTOCOL_VIOLATION, f"{kind} in a plaintext round", now)
        if device_id not in self._pending:
            return [self._log("message_ignored", device=device_id, kind=kind, why="already answered")]
        try:
            msg = codec.masked_input_from_proto(message, self.ids, **self._wire_kwargs)
        except WireError as exc:
            return self._drop(device_id, P.ABORT_REASON_PROTOCOL_VIOLATION, str(exc), now)
        self._sum += msg.vector
        self._pending.discard(device_id)
        self._counted.append(device_id)
        self.completion[self.phase.value] = now - self._stage_started
        return []

    def device_lost(self, device_id: int, now: float, why: str = "disconnected") -> list[Action]:
        if not self.phase.is_collecting or not self.ids.has_device(device_id) or device_id in self._out:
            return []
        if device_id in self._counted:  # its input is in; nothing more is asked of it
            return []
        self._pending.discard(device_id)
        self._mark_out(device_id, why)
        return [self._log("device_lost", device=device_id, stage=self.phase.value, why=why)]

    def tick(self, now: float) -> list[Action]:
        if self.phase.is_collecting and (not self._pending or now >= self.deadline):
            return self._close(now)
        return []

    def cancel(self, reason: codec.ProtoAbortReason, detail: str, now: float) -> list[Action]:
        if self.phase.is_terminal:
            return []
        if self.phase.is_collecting:
            self.timings[self.phase.value] = now - self._stage_started
        return self._end_aborted(reason, detail, notify=self.live_devices())

    # ------------------------------------------------------------ internals

    def _drop(self, device_id: int, reason: codec.ProtoAbortReason, detail: str, now: float) -> list[Action]:
        if not self.ids.has_device(device_id) or device_id in self._out:
            return [self._log("message_discarded", device=device_id, why=detail)]
        self._pending.discard(device_id)
        if device_id in self._counted:  # a counted input cannot be taken back
            return [self._log("message_ignored", device=device_id, why=detail)]
        return self._notify_out(device_id, reason, detail)

    def _close(self, now: float) -> list[Action]:
        actions: list[Action] = []
        stage = self.phase
        for d in sorted(self._pending):
            actions += self._notify_out(d, P.ABORT_REASON_DEADLINE_MISSED, f"missed the {stage.value} deadline")
        self._pending.clear()
        self.timings[stage.value] = now - self._stage_started
        self._stage_started = now
        n = len(self._counted)
        if n < self.config.threshold:
            detail = f"too_few_survivors at masked_input: {n} inputs, threshold {self.config.threshold}"
            return actions + self._end_aborted(P.ABORT_REASON_TOO_FEW_SURVIVORS, detail,
                                               notify=[d for d in self._counted])
        encoded = self._sum.astype(np.uint32)  # mod 2^32; aggregate_result reduces it mod 2^w
        self.result = aggregate_result(self.config, self.metrics, encoded, tuple(sorted(self._counted)), self.mechanism)
        self.phase = RoundState.AGGREGATING
        self.deadline = math.inf
        return actions + [
            PhaseChanged(self.phase),
            AggregateReady(self.result),
            self._log("aggregate_ready", counted=n, insecure_plaintext=True),
        ]


__all__ = ["PlaintextRoundMachine"]
