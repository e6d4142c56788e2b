"""FedMMF hybrid rounds (coordinator/hybrid.py): plaintext inputs taken during
ADVERTISE_KEYS plus the secure sum of the others; the total is exact."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.hybrid import HybridRoundMachine
from coordinator.rounds import Broadcast
from coordinator.store import RoundState
from fedmask_proto.v1 import common_pb2

from test_round_machine import Driver

P = common_pb2


def hybrid(n: int, plaintext: list[int], **kw) -> Driver:
    return Driver(n=n, machine=HybridRoundMachine, plaintext=plaintext, **kw)


def cohort(n: int) -> list[int]:
    return [100 + 3 * i for i in range(n)]


@pytest.mark.parametrize("n, n_plain, kw", [(8, 3, dict()), (10, 2, dict(active=True)),
                                            (8, 3, dict(metric_names=("examples",)))])
def test_total_is_the_exact_sum_of_plaintext_and_secure_inputs(n, n_plain, kw):
    plain = cohort(n)[:n_plain]
    d = hybrid(n, plain, **kw)
    d.run()
    m = d.m
    assert m.phase is RoundState.AGGREGATING
    assert set(m.result.counted) == set(m.cohort)
    assert m.plaintext == plain
    # the round's total is the plaintext sum of every counted device's encoded input, bit for bit
    assert np.array_equal(m.result.encoded_sum, d.expected_sum())
    mean = np.mean(np.stack([np.asarray(d.devices[x].update) for x in m.cohort]), axis=0)
    assert np.allclose(m.result.decoded_mean, mean, atol=1e-6)
    assert m.survivors()["plaintext"] == sorted(plain)
    assert set(m.survivors()["advertise_keys"]) == set(m.cohort) - set(plain)  # U1: the secure subset
    assert m.path_metrics() == {"hybrid.plaintext_devices": float(n_plain), "hybrid.secure_devices": float(n - n_plain),
                                "hybrid.unprotected_contributions": float(n_plain)}
    assert all(not d.notices[x] for x in m.cohort)
    actions = m.committed(9, 1.0)
    bc = [a for a in actions if isinstance(a, Broadcast)][0]
    assert bc.message.round_committed.contributors == n


def test_without_plaintext_devices_it_is_a_secure_round():
    d = hybrid(6, [])
    d.run()
    assert d.m.phase is RoundState.AGGREGATING and d.m.plaintext == []
    assert np.array_equal(d.m.result.encoded_sum, d.expected_sum())


def test_too_few_secure_devices_commit_the_plaintext_sum_alone():
    n = 8  # threshold 5 on the complete graph of 8: three secure devices cannot run secagg
    plain = cohort(n)[:5]
    d = hybrid(n, plain)
    d.run()
    m = d.m
    assert m.config.threshold > n - len(plain)
    assert m.phase is RoundState.AGGREGATING, m.abort_detail
    assert m.result.counted == tuple(plain)
    assert np.array_equal(m.result.encoded_sum, d.expected_sum())
    secure = set(m.cohort) - set(plain)
    assert all(d.notices[x] for x in secure)  # the secure part ended for them; nothing of theirs was revealed
    assert all(not d.notices[x] for x in plain)
    assert m.path_metrics()["hybrid.secure_devices"] == 0.0


def test_every_device_plaintext_commits_when_at_least_the_threshold():
    n = 5
    d = hybrid(n, cohort(n))
    d.run()
    assert d.m.phase is RoundState.AGGREGATING
    assert d.m.result.counted == tuple(cohort(n))
    assert np.array_equal(d.m.result.encoded_sum, d.expected_sum())


def test_too_few_of_either_kind_aborts():
    n = 8
    plain = cohort(n)[:4]  # threshold 5: neither 4 secure nor 4 plaintext devices are enough
    d = hybrid(n, plain)
    d.run()
    assert d.m.phase is RoundState.ABORTED
    assert "plaintext input(s) are fewer than the threshold" in d.m.abort_detail
    assert d.ended and not d.ended[0].committed


def test_a_plaintext_device_after_its_keys_is_dropped_and_lost_plaintext_devices_stay_counted():
    n = 6
    d = hybrid(n, [cohort(n)[0]])
    d.feed()
    m = d.m
    late = cohort(n)[1]  # advertised keys, then sends a plaintext input: a protocol violation
    enc = d.devices[late].encoded
    assert enc is not None
    from fedmask_proto.v1 import secagg_pb2

    p = secagg_pb2.MaskedInput(session_id=m.session_id, round_number=m.number, device_id=late,
                               masked_vector=enc.astype("<u4").tobytes(), length=m.config.vector_length,
                               modulus_bits=m.config.encoding.modulus_bits)
    d.apply(m.handle(late, p, 0.0))
    assert d.notices[late] == [P.ABORT_REASON_PROTOCOL_VIOLATION]
    assert m.device_lost(cohort(n)[0], 0.0) == []  # its plaintext input is already counted
    d.run()
    assert m.phase is RoundState.AGGREGATING
    assert cohort(n)[0] in m.result.counted and late not in m.result.counted
    assert np.array_equal(m.result.encoded_sum, d.expected_sum())
