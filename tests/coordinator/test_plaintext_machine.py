"""The INSECURE plaintext round machine (benchmark baseline): one stage,
unmasked encoded inputs summed exactly; bad input drops the sender only;
too few inputs abort; a silent device is dropped at the deadline."""

from __future__ import annotations

import numpy as np

from coordinator.plaintext import PlaintextRoundMachine
from coordinator.rounds import AggregateReady, RoundEnded, Send
from coordinator.store import RoundState
from fedmask_proto.v1 import common_pb2, secagg_pb2
from secagg.config import SecAggConfig

P = common_pb2
SESSION = b"plaintext-sess16"
L = 10
COHORT = [11, 12, 13, 14, 15]


def machine(threshold: int | None = 3, cohort: list[int] = COHORT) -> PlaintextRoundMachine:
    config = SecAggConfig.create(num_clients=len(cohort), vector_length=L, session_id=SESSION, neighbors="all",
                                 threshold=threshold)
    m = PlaintextRoundMachine(number=4, config=config, cohort=cohort, deadlines={"masked_input": 5.0})
    assert m.phase is RoundState.MASKED_INPUT
    m.start(0.0)
    return m


def upload(m: PlaintextRoundMachine, device: int, x: np.ndarray, **over) -> list:
    enc = m.config.encoding.encode(x)
    p = secagg_pb2.MaskedInput(session_id=SESSION, round_number=4, device_id=device, masked_vector=enc.tobytes(),
                               length=L, modulus_bits=m.config.encoding.modulus_bits)
    for k, v in over.items():
        setattr(p, k, v)
    return m.handle(device, p, 1.0), enc


def test_sum_is_exact_and_the_stage_closes_when_all_answered() -> None:
    m = machine()
    rng = np.random.default_rng(0)
    encs = []
    for d in COHORT:
        actions, enc = upload(m, d, rng.uniform(-1, 1, L))
        assert actions == []
        encs.append(enc)
    assert m.wants_close
    actions = m.tick(1.5)
    assert any(isinstance(a, AggregateReady) for a in actions) and m.phase is RoundState.AGGREGATING
    want = np.sum(encs, axis=0, dtype=np.uint64).astype(np.uint32)
    assert np.array_equal(m.result.encoded_sum, want)
    assert m.result.counted == tuple(COHORT)
    assert m.survivors() == {"masked_input": COHORT} and m.dropout_ids() == {}
    assert np.allclose(m.result.decoded_mean, m.config.encoding.decode_mean(want, 5))


def test_bad_input_drops_only_the_sender_and_silent_devices_miss_the_deadline() -> None:
    m = machine(threshold=4, cohort=[11, 12, 13, 14, 15, 16, 17])
    x = np.full(L, 0.25)
    actions, _ = upload(m, 11, x, masked_vector=b"\0" * (4 * L - 4))  # wrong length
    notice = [a for a in actions if isinstance(a, Send)][0].message.abort
    assert notice.reason == P.ABORT_REASON_PROTOCOL_VIOLATION and notice.device_id == 11
    adv = secagg_pb2.AdvertiseKeys(session_id=SESSION, round_number=4, device_id=12)
    assert any(isinstance(a, Send) for a in m.handle(12, adv, 1.0))  # no key stages in plaintext rounds
    stale = m.handle(13, secagg_pb2.MaskedInput(session_id=SESSION, round_number=3, device_id=13), 1.0)
    assert [a.event for a in stale] == ["message_discarded"]  # another round: ignored, still expected
    for d in (13, 14, 15, 16):
        upload(m, d, x)
    again, _ = upload(m, 14, x)
    assert [a.event for a in again] == ["message_ignored"]  # its first answer stands
    assert not m.wants_close and m.tick(4.9) == []
    m.tick(5.0)  # 17 is silent
    assert m.phase is RoundState.AGGREGATING and m.result.counted == (13, 14, 15, 16)
    assert m.dropout_ids() == {"masked_input": [11, 12, 17]}


def test_too_few_inputs_abort_with_a_typed_reason() -> None:
    m = machine(threshold=4)
    for d in COHORT[:3]:
        upload(m, d, np.zeros(L))
    actions = m.tick(6.0)
    ended = [a for a in actions if isinstance(a, RoundEnded)]
    assert ended and not ended[0].committed and ended[0].reason == P.ABORT_REASON_TOO_FEW_SURVIVORS
    assert m.phase is RoundState.ABORTED
    told = {a.device_id for a in actions if isinstance(a, Send)}
    assert told == set(COHORT)  # 3 counted told of the abort, 2 silent told they missed the deadline


def test_a_lost_device_is_a_dropout_unless_its_input_is_in() -> None:
    m = machine()
    upload(m, 11, np.zeros(L))
    assert m.device_lost(11, 1.0) == []  # already counted
    assert m.device_lost(12, 1.0)[0].event == "device_lost"
    assert m.dropout_ids() == {"masked_input": [12]}
