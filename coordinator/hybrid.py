"""FedMMF hybrid rounds: UNPROTECTED plaintext inputs plus a secure sum (D64-D66).

Switched on by `hybrid.unprotected_plaintext_j_bound` (off by default,
refused without TLS on the device listener). The RoundTask then carries the
bound (`wire.protocol.HYBRID_J_BOUND_HYPERPARAMETER`); each device compares
its own FedMMF privacy indicator J with the bound and with its client's own
cap (`fedmask client --unprotected-plaintext-j-bound`; a client without it
never goes plaintext) and chooses its path locally:

- **plaintext**: during ADVERTISE_KEYS (instead of its AdvertiseKeys) it
  sends a MaskedInput whose vector is its encoded update *unmasked* (the
  round's fixed-point encoding followed by its metric limbs, exactly what a
  secure device masks). The machine adds it to a plaintext sum, counts it,
  and takes the device out of the secure part (secagg sees a device that
  did not advertise keys: it is not in U1). Nothing more is asked of it.
- **secure**: it advertises keys and runs secure aggregation among the
  devices that did (U1). The round's Shamir threshold t (chosen for the
  whole cohort) applies to this subset, as does each device's own floor
  (D31; the subset is at least t, and t is above the floor's fraction of
  the cohort, hence of the subset).

The round's result is the exact coordinatewise sum, modulo 2^w, of the
plaintext inputs and the unmasked secure sum; the encoding leaves headroom
for the whole cohort, so nothing wraps and the total equals the plaintext
sum of every counted device's encoded input bit for bit. `counted` lists
the secure devices (U3) and then the plaintext ones; the metric totals
(D35) cover both, so `count.devices` still equals the counted devices.

When the secure part aborts (too few secure devices at any stage, or every
device went plaintext) no secure input was ever revealed; the round then
commits the plaintext sum alone if it has at least t plaintext inputs (the
count a committed round needs in every mode), and aborts otherwise.

The coordinator learns each plaintext device's update and which path every
device took; `path_metrics` puts the counts into the round record and
`survivors()["plaintext"]` the plaintext devices' ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from coordinator.aggregate import aggregate_result
from coordinator.rounds import Action, AggregateReady, LogEvent, PhaseChanged, RoundEnded, RoundMachine, Send
from coordinator.store import RoundState
from fedmask_proto.v1 import common_pb2, secagg_pb2
from secagg import messages as sm
from secagg.errors import AbortReason
from wire import WireError
from wire import secagg_codec as codec

P = common_pb2


@dataclass
class HybridRoundMachine(RoundMachine):
    """See the module doc: a secure round that also takes plaintext inputs
    during ADVERTISE_KEYS."""

    #: device ids whose plaintext input is counted, in arrival order
    plaintext: list[int] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._plain_sum = np.zeros(self.config.vector_length, dtype=np.uint64)
        self._plain_set: set[int] = set()
        self._secure_counted: tuple[int, ...] = ()

    # ------------------------------------------------------------ properties

    def survivors(self) -> dict[str, list[int]]:
        out = super().survivors()
        out["plaintext"] = sorted(self.plaintext)
        return out

    def path_metrics(self) -> dict[str, float]:
        """What the round record keeps about the paths: plaintext inputs
        counted (UNPROTECTED contributions) and secure inputs counted."""
        return {
            "hybrid.plaintext_devices": float(len(self.plaintext)),
            "hybrid.secure_devices": float(len(self._secure_counted)),
            "hybrid.unprotected_contributions": float(len(self.plaintext)),
        }

    # ------------------------------------------------------------ events

    def handle(self, device_id: int, message: object, now: float) -> list[Action]:
        if device_id in self._plain_set:
            screened = self._screen(device_id, message, now)
            if screened is not None:
                return screened
            return [self._log("message_ignored", device=device_id, kind=type(message).__name__,
                              why="its plaintext input is counted")]
        if isinstance(message, secagg_pb2.MaskedInput) and self.phase is RoundState.ADVERTISE_KEYS:
            return self._plaintext_input(device_id, message, now)
        return super().handle(device_id, message, now)

    def device_lost(self, device_id: int, now: float, why: str = "disconnected") -> list[Action]:
        if device_id in self._plain_set:  # its input is in; nothing more is asked of it
            return []
        return super().device_lost(device_id, now, why)

    # ------------------------------------------------------------ internals

    def _plaintext_input(self, device_id: int, message: secagg_pb2.MaskedInput, now: float) -> list[Action]:
        screened = self._screen(device_id, message, now)
        if screened is not None:
            return screened
        sid = self.ids.secagg(device_id)
        if sid not in self._server.pending:  # it already advertised keys: it chose the secure path
            return self._drop(device_id, P.ABORT_REASON_PROTOCOL_VIOLATION,
                              "a plaintext input after this device's AdvertiseKeys", now)
        try:
            msg = codec.masked_input_from_proto(message, self.ids, **self._wire_kwargs)
        except WireError as exc:
            return self._drop(device_id, P.ABORT_REASON_PROTOCOL_VIOLATION, str(exc), now)
        # out of the secure part: to secagg it is a device that never advertised keys
        self._server, _ = self._server.handle(
            sid, sm.ClientAbort(session_id=self.session_id, round_idx=self.number, device_id=sid,
                                reason=AbortReason.CANCELLED)
        )
        self._plain_sum += msg.vector
        self.plaintext.append(device_id)
        self._plain_set.add(device_id)
        self.completion[self.phase.value] = now - self._stage_started
        return [self._log("plaintext_input", device=device_id, unprotected=True)]

    def _combined(self, secure_sum: np.ndarray | None, secure_counted: tuple[int, ...]) -> np.ndarray:
        """(plaintext sum + secure sum) mod 2^w as uint32."""
        total = self._plain_sum.copy()
        if secure_sum is not None:
            total += secure_sum.astype(np.uint64)
        total %= np.uint64(1) << np.uint64(self.config.encoding.modulus_bits)
        return total.astype(np.uint32)

    def _close(self, now: float) -> list[Action]:
        actions = super()._close(now)
        if self.phase is RoundState.AGGREGATING and self.result is not None:
            secure = self.result
            self._secure_counted = secure.counted
            self.result = aggregate_result(self.config, self.metrics, self._combined(secure.encoded_sum, secure.counted),
                                           secure.counted + tuple(self.plaintext), self.mechanism)
            return [AggregateReady(self.result) if isinstance(a, AggregateReady) else a for a in actions] + [
                self._log("hybrid_sum", secure=len(secure.counted), plaintext=len(self.plaintext))
            ]
        if self.phase is RoundState.ABORTED and self.plaintext:
            return self._plaintext_only(actions)
        return actions

    def _plaintext_only(self, actions: list[Action]) -> list[Action]:
        """The secure part aborted while plaintext inputs are counted: commit
        them alone if there are at least t of them (module doc)."""
        n = len(self.plaintext)
        if n < self.config.threshold:
            detail = f"{self.abort_detail}; {n} plaintext input(s) are fewer than the threshold {self.config.threshold}"
            self.abort_detail = detail
            return actions
        secure_detail = self.abort_detail
        kept: list[Action] = []
        for a in actions:
            if isinstance(a, (RoundEnded, PhaseChanged)):
                continue
            if isinstance(a, LogEvent) and a.event == "round_aborted":
                continue
            if isinstance(a, Send) and a.device_id in self._plain_set:
                continue  # the end of the secure part is not its concern
            kept.append(a)
        self._out -= self._plain_set
        self.abort_reason, self.abort_detail = None, ""
        self.result = aggregate_result(self.config, self.metrics, self._combined(None, ()), tuple(self.plaintext),
                                       self.mechanism)
        self.phase = RoundState.AGGREGATING
        return kept + [
            PhaseChanged(self.phase),
            AggregateReady(self.result),
            self._log("aggregate_ready", counted=n, plaintext=n, secure_part=f"aborted: {secure_detail}"),
        ]


__all__ = ["HybridRoundMachine"]
