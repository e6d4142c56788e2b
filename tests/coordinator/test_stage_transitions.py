"""Stage-by-message transition matrix of the round machine.

For every phase of a round (active mode, so every stage occurs) and every
client stage message, exactly one pair is a valid transition: the phase's
own message, which is accepted. A message of an earlier stage is a replay
and is discarded (the device stays in the round); one of a later stage is a
protocol violation and drops the sender with a PROTOCOL_VIOLATION notice;
after the stages (aggregating and terminal phases) everything is discarded.
"""

from __future__ import annotations

import itertools

import pytest

from coordinator.rounds import LogEvent
from coordinator.store import RoundState
from fedmask_proto.v1 import common_pb2
from secagg.stages import Stage
from wire.protocol import CLIENT_MESSAGE_STAGE

from test_round_machine import SESSION, Driver

PHASES = [RoundState(s.value) for s in Stage] + [RoundState.AGGREGATING]


def _drive_to(phase: RoundState) -> tuple[Driver, dict[type, tuple[int, object]]]:
    """A round in `phase`, the devices' replies for it still queued; the first
    message of each earlier type seen on the way, by type."""
    d = Driver(n=5, active=True)
    seen: dict[type, tuple[int, object]] = {}
    for _ in range(20):
        if d.m.phase is phase:
            return d, seen
        while d.inbox:
            dev, p = d.inbox.pop(0)
            seen.setdefault(type(p), (dev, p))
            d.apply(d.m.handle(dev, p, d.now))
        d.apply(d.m.tick(d.now))
    raise AssertionError(f"never reached {phase}")


def _header_only(kind: type, device: int) -> object:
    return kind(session_id=SESSION, round_number=7, device_id=device)


@pytest.mark.parametrize(("phase", "kind"), list(itertools.product(PHASES, CLIENT_MESSAGE_STAGE)),
                         ids=lambda v: getattr(v, "value", getattr(v, "__name__", str(v))))
def test_transition_matrix(phase: RoundState, kind: type) -> None:
    d, seen = _drive_to(phase)
    stage = CLIENT_MESSAGE_STAGE[kind]
    queued = [(dev, p) for dev, p in d.inbox if type(p) is kind]
    if phase.stage is not None and stage is phase.stage:  # the valid transition
        dev, message = queued[0]
    elif kind in seen:  # a replay of a real earlier message
        dev, message = seen[kind]
    else:  # a later stage: content never matters, the stage check comes first
        dev = d.m.live_devices()[0]
        message = _header_only(kind, dev)
    notices_before = list(d.notices[dev])
    actions = d.m.handle(dev, message, d.now)
    d.apply(actions)
    left = {x for ids in d.m.dropouts.values() for x in ids}
    if phase.stage is None:
        assert dev not in left and d.notices[dev] == notices_before
        assert any(isinstance(a, LogEvent) and a.event == "message_discarded" for a in actions)
    elif stage is phase.stage:
        assert dev not in left and d.notices[dev] == notices_before
        assert d.m.completion.get(phase.value) is not None
    elif stage.order < phase.stage.order:
        assert dev not in left and d.notices[dev] == notices_before
        assert any(isinstance(a, LogEvent) and a.event == "message_discarded" for a in actions)
    else:
        assert dev in left
        assert d.notices[dev][len(notices_before):] == [common_pb2.ABORT_REASON_PROTOCOL_VIOLATION]


def test_every_stage_has_one_message_and_a_phase() -> None:
    assert sorted(CLIENT_MESSAGE_STAGE.values(), key=lambda s: s.order) == list(Stage)
    for s in Stage:
        assert RoundState(s.value).stage is s
