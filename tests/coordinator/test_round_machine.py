"""The pure round state machine, driven without gRPC by fake devices."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.rounds import (
    AggregateReady,
    Broadcast,
    PhaseChanged,
    RoundEnded,
    RoundMachine,
    RoundPhase,
    Send,
)
from fedmask_proto.v1 import common_pb2, secagg_pb2, session_pb2
from secagg import identity
from secagg.config import SecAggConfig
from wire import RoundIds, WireError, build_round_task, parse_round_task

from coordinator_fakes import FakeDevice, identity_private

P = common_pb2
DEADLINES = {"advertise_keys": 10.0, "share_keys": 10.0, "share_check": 10.0, "masked_input": 10.0, "consistency_check": 10.0, "unmasking": 10.0}
SESSION = b"0123456789abcdef"


class Driver:
    """Delivers the machine's Send actions to fake devices and their replies back."""

    def __init__(self, n=5, *, silent=None, tamper=None, active=False, neighbors="all", number=7, L=12, threshold=None):
        self.now = 0.0
        cohort = [100 + 3 * i for i in range(n)]
        self.config = SecAggConfig.create(num_clients=n, vector_length=L, session_id=SESSION, neighbors=neighbors,
                                          active_adversary=active, threshold=threshold)
        keys = {d: identity_private(d) for d in cohort}
        ident = {d: identity.public_bytes(k) for d, k in keys.items()} if active else None
        self.m = RoundMachine(number=number, config=self.config, cohort=cohort, deadlines=DEADLINES, identity_keys=ident)
        silent = silent or {}
        self.devices = {
            d: FakeDevice(d, seed=1, silent_at=silent.get(d), tamper=tamper, identity_key=keys[d] if active else None)
            for d in cohort
        }
        self.notices: dict[int, list[int]] = {d: [] for d in cohort}
        self.ended: list[RoundEnded] = []
        self.phases: list[RoundPhase] = []
        self.broadcasts: list[Broadcast] = []
        ids = RoundIds.from_cohort(cohort)
        self.inbox: list[tuple[int, object]] = []
        for d in cohort:
            task = build_round_task(config=self.config, round_number=number, ids=ids, devices=[d], model_name="synthetic",
                                    model_version=1, global_parameters={"mean": np.zeros(L, np.float32)})
            for p in self.devices[d].on_task(parse_round_task(task, hosted=[d])):
                self.inbox.append((d, p))
        self.apply(self.m.start(self.now))

    def apply(self, actions):
        for a in actions:
            if isinstance(a, Send):
                inner = getattr(a.message, a.message.WhichOneof("message"))
                if isinstance(inner, P.AbortNotice):
                    self.notices[a.device_id].append(inner.reason)
                for p in self.devices[a.device_id].on_message(inner):
                    self.inbox.append((a.device_id, p))
            elif isinstance(a, RoundEnded):
                self.ended.append(a)
            elif isinstance(a, PhaseChanged):
                self.phases.append(a.phase)
            elif isinstance(a, Broadcast):
                self.broadcasts.append(a)

    def feed(self):
        while self.inbox:
            d, p = self.inbox.pop(0)
            self.apply(self.m.handle(d, p, self.now))

    def run(self, max_steps=20):
        for _ in range(max_steps):
            self.feed()
            if not self.m.phase.is_collecting:
                return
            if not self.m.wants_close:
                self.now = self.m.deadline  # nobody else will answer: let the deadline pass
            self.apply(self.m.tick(self.now))
        raise AssertionError("round did not end")

    def expected_sum(self):
        counted = self.m.result.counted
        enc = np.stack([self.devices[d].encoded for d in counted])
        return enc.sum(axis=0, dtype=np.uint64).astype(np.uint32)


@pytest.mark.parametrize("kw", [dict(), dict(n=10, neighbors=4), dict(active=True), dict(n=8, neighbors=4, active=True)])
def test_honest_round_aggregates_exactly(kw):
    d = Driver(**kw)
    d.run()
    assert d.m.phase is RoundPhase.AGGREGATING
    assert set(d.m.result.counted) == set(d.m.cohort)
    assert np.array_equal(d.m.result.encoded_sum, d.expected_sum())
    mean = np.mean([d.devices[x].update for x in d.m.cohort], axis=0)
    assert np.allclose(d.m.result.decoded_mean, mean, atol=1e-6)
    stages = [RoundPhase.SHARE_KEYS, RoundPhase.SHARE_CHECK, RoundPhase.MASKED_INPUT] + ([RoundPhase.CONSISTENCY_CHECK] if kw.get("active") else [])
    assert d.phases == [RoundPhase.ADVERTISE_KEYS, *stages, RoundPhase.UNMASKING, RoundPhase.AGGREGATING]
    assert d.now == 0.0  # every stage closed early: nobody was waited for
    actions = d.m.committed(42, 1.0)
    assert d.m.phase is RoundPhase.COMMITTED
    bc = [a for a in actions if isinstance(a, Broadcast)][0]
    assert bc.message.round_committed.new_model_version == 42
    assert bc.message.round_committed.contributors == len(d.m.cohort)
    assert set(d.m.survivors()) >= {"advertise_keys", "share_keys", "share_check", "masked_input", "unmasking"}


@pytest.mark.parametrize("stage", ["advertise_keys", "share_keys", "share_check", "masked_input", "consistency_check", "unmasking"])
def test_one_device_misses_each_stage_deadline(stage):
    late = 109
    d = Driver(n=6, silent={late: stage}, active=stage == "consistency_check")
    d.run()
    assert d.m.phase is RoundPhase.AGGREGATING, d.ended
    assert d.notices[late] == [P.ABORT_REASON_DEADLINE_MISSED]
    assert d.m.dropout_ids()[stage] == [late]
    counted_late = late in d.m.result.counted
    assert counted_late == (stage in ("consistency_check", "unmasking"))  # its masked input was already in
    assert np.array_equal(d.m.result.encoded_sum, d.expected_sum())
    assert d.m.timings[stage] == pytest.approx(DEADLINES[stage])


def test_below_threshold_aborts_with_a_typed_reason():
    d = Driver(n=5, silent={100: "share_keys", 103: "share_keys", 106: "share_keys"})
    d.run()
    assert d.m.phase is RoundPhase.ABORTED
    assert d.ended == [RoundEnded(False, P.ABORT_REASON_TOO_FEW_SURVIVORS, d.ended[0].detail)]
    assert "too_few_shared" in d.ended[0].detail
    for dev in (109, 112):  # the devices still in the round learn it is over
        assert d.notices[dev] == [P.ABORT_REASON_TOO_FEW_SURVIVORS]


def test_wrong_round_and_replays_are_discarded_not_dropped():
    d = Driver(n=4)
    d.feed()  # advertise done; stage 1 open, ShareKeys in flight? no: feed delivered everything
    assert d.m.phase in (RoundPhase.ADVERTISE_KEYS, RoundPhase.SHARE_KEYS)
    stale = secagg_pb2.AdvertiseKeys(session_id=b"other-session-id", round_number=7, device_id=100,
                                     c_pk=b"a" * 32, s_pk=b"b" * 32)
    assert all(not isinstance(a, Send) for a in d.m.handle(100, stale, 0.0))
    old_round = secagg_pb2.AdvertiseKeys(session_id=SESSION, round_number=6, device_id=100)
    assert all(not isinstance(a, Send) for a in d.m.handle(100, old_round, 0.0))
    d.apply(d.m.tick(0.0))
    assert d.m.phase is RoundPhase.SHARE_KEYS
    replay = secagg_pb2.AdvertiseKeys(session_id=SESSION, round_number=7, device_id=100, c_pk=b"a" * 32, s_pk=b"b" * 32)
    assert all(not isinstance(a, Send) for a in d.m.handle(100, replay, 0.0))  # earlier stage: replay
    d.run()
    assert d.m.phase is RoundPhase.AGGREGATING and len(d.m.result.counted) == 4


def test_malformed_vector_drops_only_that_device():
    def tamper(device, p):
        if device == 103 and isinstance(p, secagg_pb2.MaskedInput):
            p.masked_vector = p.masked_vector[:-4]
            p.length -= 1
        return p

    d = Driver(n=5, tamper=tamper)
    d.run()
    assert d.m.phase is RoundPhase.AGGREGATING
    assert d.notices[103] == [P.ABORT_REASON_PROTOCOL_VIOLATION]
    assert 103 not in d.m.result.counted and d.m.dropout_ids()["masked_input"] == [103]
    assert np.array_equal(d.m.result.encoded_sum, d.expected_sum())


def test_message_of_a_later_stage_is_a_violation():
    d = Driver(n=5)
    early = secagg_pb2.MaskedInput(session_id=SESSION, round_number=7, device_id=106,
                                   masked_vector=b"\0" * 48, length=12, modulus_bits=32)
    actions = d.m.handle(106, early, 0.0)
    assert any(isinstance(a, Send) and a.message.abort.reason == P.ABORT_REASON_PROTOCOL_VIOLATION for a in actions)
    d.run()
    assert d.m.phase is RoundPhase.AGGREGATING and 106 not in d.m.result.counted
    assert np.array_equal(d.m.result.encoded_sum, d.expected_sum())


def test_secagg_check_failure_drops_the_device():
    def tamper(device, p):  # a signature where none is expected: secagg drops the sender
        if device == 100 and isinstance(p, secagg_pb2.AdvertiseKeys):
            p.signature = b"s" * 64
        return p

    d = Driver(n=5, tamper=tamper)
    d.run()
    assert d.notices[100] == [P.ABORT_REASON_PROTOCOL_VIOLATION]
    assert d.m.phase is RoundPhase.AGGREGATING and 100 not in d.m.result.counted


def test_spoofed_device_id_and_garbage_keys():
    d = Driver(n=5)
    spoof = secagg_pb2.AdvertiseKeys(session_id=SESSION, round_number=7, device_id=103, c_pk=b"a" * 32, s_pk=b"b" * 32)
    actions = d.m.handle(100, spoof, 0.0)  # device 100's stream speaks for 103
    assert any(isinstance(a, Send) and a.device_id == 100 for a in actions)
    d2 = Driver(n=5)
    bad = secagg_pb2.AdvertiseKeys(session_id=SESSION, round_number=7, device_id=112, c_pk=b"\0" * 32, s_pk=b"b" * 32)
    d2.inbox = [(dev, p) for dev, p in d2.inbox if dev != 112] + [(112, bad)]
    d2.run()
    assert d2.notices[112] == [P.ABORT_REASON_PROTOCOL_VIOLATION]
    assert d2.m.phase is RoundPhase.AGGREGATING and 112 not in d2.m.result.counted


def test_device_lost_and_client_abort_are_dropouts():
    d = Driver(n=6)
    d.apply(d.m.device_lost(100, 0.0, "disconnected"))
    withdraw = P.AbortNotice(session_id=SESSION, round_number=7, device_id=103, reason=P.ABORT_REASON_CLIENT_LEAVING)
    d.apply(d.m.handle(103, withdraw, 0.0))
    d.run()
    assert d.m.phase is RoundPhase.AGGREGATING
    assert set(d.m.result.counted) == {106, 109, 112, 115}
    assert d.m.dropouts["advertise_keys"] == {100: "disconnected", 103: "client_abort:client_leaving"}
    assert d.notices[100] == [] and d.notices[103] == []


def test_cancel_tells_every_live_device():
    d = Driver(n=4)
    d.feed()
    d.apply(d.m.tick(0.0))
    d.apply(d.m.cancel(P.ABORT_REASON_COORDINATOR_SHUTDOWN, "shutting down", 1.0))
    assert d.m.phase is RoundPhase.ABORTED
    assert all(P.ABORT_REASON_COORDINATOR_SHUTDOWN in v for v in d.notices.values())
    assert d.ended[-1].reason == P.ABORT_REASON_COORDINATOR_SHUTDOWN
    assert d.m.cancel(P.ABORT_REASON_COORDINATOR_SHUTDOWN, "again", 2.0) == []


def test_commit_failure_aborts():
    d = Driver(n=4)
    d.run()
    actions = d.m.commit_failed("disk full", 5.0)
    assert d.m.phase is RoundPhase.ABORTED and any(isinstance(a, RoundEnded) and not a.committed for a in actions)
    with pytest.raises(RuntimeError):
        d.m.committed(1, 6.0)


def test_metrics_are_summed_and_validated():
    d = Driver(n=4)
    ok = session_pb2.RoundMetrics(session_id=SESSION, round_number=7, device_ids=[100, 103],
                                  sums={"loss": 1.5}, counts={"examples": 30})
    d.m.add_metrics(ok, hosted={100, 103})
    d.m.add_metrics(session_pb2.RoundMetrics(session_id=SESSION, round_number=7, device_ids=[106],
                                             sums={"loss": 0.5}, counts={"examples": 10}), hosted={106})
    assert d.m.metric_sums == {"loss": 2.0} and d.m.metric_counts == {"examples": 40}
    bad = [
        (ok, {100, 103}, "repeats"),
        (session_pb2.RoundMetrics(session_id=SESSION, round_number=8, device_ids=[109]), {109}, "another round"),
        (session_pb2.RoundMetrics(session_id=SESSION, round_number=7, device_ids=[109]), {100}, "outside"),
        (session_pb2.RoundMetrics(session_id=SESSION, round_number=7, device_ids=[109], sums={"x": float("nan")}), {109}, "finite"),
        (session_pb2.RoundMetrics(session_id=SESSION, round_number=7, device_ids=[]), {109}, "distinct"),
    ]
    for msg, hosted, match in bad:
        with pytest.raises(WireError, match=match):
            d.m.add_metrics(msg, hosted=hosted)


def test_aggregate_ready_is_announced_once():
    d = Driver(n=3)
    seen = []
    orig = d.apply

    def spy(actions):
        actions = list(actions)
        seen.extend(a for a in actions if isinstance(a, AggregateReady))
        orig(actions)

    d.apply = spy
    d.run()
    assert len(seen) == 1 and seen[0].result is d.m.result
