"""The pure round state machine, driven without gRPC by fake devices."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from coordinator.rounds import (
    AggregateReady,
    Broadcast,
    PhaseChanged,
    RoundEnded,
    RoundMachine,
    Send,
)
from coordinator.store import RoundState
from fedmask_proto.v1 import common_pb2, secagg_pb2, session_pb2
from secagg import identity
from secagg.config import SecAggConfig
from wire import RoundIds, WireError, build_round_task, parse_round_task
from wire.round_metrics import REAL_UNIT, SLOTS, MetricLayout, MetricRangeError

from coordinator_fakes import FakeDevice, fake_metric_values, identity_private

P = common_pb2
DEADLINES = {"advertise_keys": 10.0, "share_keys": 10.0, "share_check": 10.0, "masked_input": 10.0, "consistency_check": 10.0, "unmasking": 10.0}
SESSION = b"0123456789abcdef"


class Driver:
    """Delivers the machine's Send actions to fake devices and their replies back."""

    def __init__(self, n=5, *, silent=None, tamper=None, active=False, neighbors="all", number=7, L=12, threshold=None,
                 metric_names=(), metric_limbs=None, machine=RoundMachine, plaintext=()):
        self.now = 0.0
        cohort = [100 + 3 * i for i in range(n)]
        config = SecAggConfig.create(num_clients=n, vector_length=L, session_id=SESSION, neighbors=neighbors,
                                     active_adversary=active, threshold=threshold)
        self.layout = MetricLayout.for_round(metric_names, config.encoding)
        self.config = dataclasses.replace(config, vector_length=L + self.layout.coordinates)
        keys = {d: identity_private(d) for d in cohort}
        ident = {d: identity.public_bytes(k) for d, k in keys.items()} if active else None
        self.m = machine(number=number, config=self.config, cohort=cohort, deadlines=DEADLINES, identity_keys=ident,
                              metrics=self.layout)
        silent = silent or {}
        metric_limbs = metric_limbs or {}
        self.devices = {
            d: FakeDevice(d, seed=1, silent_at=silent.get(d), tamper=tamper, identity_key=keys[d] if active else None,
                          metric_limbs=metric_limbs.get(d))
            for d in cohort
        }
        self.notices: dict[int, list[int]] = {d: [] for d in cohort}
        self.ended: list[RoundEnded] = []
        self.phases: list[RoundState] = []
        self.broadcasts: list[Broadcast] = []
        ids = RoundIds.from_cohort(cohort)
        self.inbox: list[tuple[int, object]] = []
        for d in cohort:
            task = build_round_task(config=self.config, round_number=number, ids=ids, devices=[d], model_name="synthetic",
                                    model_version=1, global_parameters={"mean": np.zeros(L, np.float32)},
                                    metrics=self.layout)
            for p in self.devices[d].on_task(parse_round_task(task, hosted=[d])):
                if d in plaintext and self.devices[d].encoded is not None:  # hybrid: its encoded input, unmasked
                    p = secagg_pb2.MaskedInput(session_id=SESSION, round_number=number, device_id=d,
                                               masked_vector=self.devices[d].encoded.astype("<u4").tobytes(),
                                               length=self.config.vector_length,
                                               modulus_bits=self.config.encoding.modulus_bits)
                    self.devices[d].silent = True  # its part is over
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
    assert d.m.phase is RoundState.AGGREGATING
    assert set(d.m.result.counted) == set(d.m.cohort)
    assert np.array_equal(d.m.result.encoded_sum, d.expected_sum())
    mean = np.mean([d.devices[x].update for x in d.m.cohort], axis=0)
    assert np.allclose(d.m.result.decoded_mean, mean, atol=1e-6)
    stages = [RoundState.SHARE_KEYS, RoundState.SHARE_CHECK, RoundState.MASKED_INPUT] + ([RoundState.CONSISTENCY_CHECK] if kw.get("active") else [])
    assert d.phases == [RoundState.ADVERTISE_KEYS, *stages, RoundState.UNMASKING, RoundState.AGGREGATING]
    assert d.now == 0.0  # every stage closed early: nobody was waited for
    actions = d.m.committed(42, 1.0)
    assert d.m.phase is RoundState.COMMITTED
    bc = [a for a in actions if isinstance(a, Broadcast)][0]
    assert bc.message.round_committed.new_model_version == 42
    assert bc.message.round_committed.contributors == len(d.m.cohort)
    assert set(d.m.survivors()) >= {"advertise_keys", "share_keys", "share_check", "masked_input", "unmasking"}


@pytest.mark.parametrize("stage", ["advertise_keys", "share_keys", "share_check", "masked_input", "consistency_check", "unmasking"])
def test_one_device_misses_each_stage_deadline(stage):
    late = 109
    d = Driver(n=6, silent={late: stage}, active=stage == "consistency_check")
    d.run()
    assert d.m.phase is RoundState.AGGREGATING, d.ended
    assert d.notices[late] == [P.ABORT_REASON_DEADLINE_MISSED]
    assert d.m.dropout_ids()[stage] == [late]
    counted_late = late in d.m.result.counted
    assert counted_late == (stage in ("consistency_check", "unmasking"))  # its masked input was already in
    assert np.array_equal(d.m.result.encoded_sum, d.expected_sum())
    assert d.m.timings[stage] == pytest.approx(DEADLINES[stage])


def test_below_threshold_aborts_with_a_typed_reason():
    d = Driver(n=5, silent={100: "share_keys", 103: "share_keys", 106: "share_keys"})
    d.run()
    assert d.m.phase is RoundState.ABORTED
    assert d.ended == [RoundEnded(False, P.ABORT_REASON_TOO_FEW_SURVIVORS, d.ended[0].detail)]
    assert "too_few_shared" in d.ended[0].detail
    for dev in (109, 112):  # the devices still in the round learn it is over
        assert d.notices[dev] == [P.ABORT_REASON_TOO_FEW_SURVIVORS]


def test_wrong_round_and_replays_are_discarded_not_dropped():
    d = Driver(n=4)
    d.feed()  # advertise done; stage 1 open, ShareKeys in flight? no: feed delivered everything
    assert d.m.phase in (RoundState.ADVERTISE_KEYS, RoundState.SHARE_KEYS)
    stale = secagg_pb2.AdvertiseKeys(session_id=b"other-session-id", round_number=7, device_id=100,
                                     c_pk=b"a" * 32, s_pk=b"b" * 32)
    assert all(not isinstance(a, Send) for a in d.m.handle(100, stale, 0.0))
    old_round = secagg_pb2.AdvertiseKeys(session_id=SESSION, round_number=6, device_id=100)
    assert all(not isinstance(a, Send) for a in d.m.handle(100, old_round, 0.0))
    d.apply(d.m.tick(0.0))
    assert d.m.phase is RoundState.SHARE_KEYS
    replay = secagg_pb2.AdvertiseKeys(session_id=SESSION, round_number=7, device_id=100, c_pk=b"a" * 32, s_pk=b"b" * 32)
    assert all(not isinstance(a, Send) for a in d.m.handle(100, replay, 0.0))  # earlier stage: replay
    d.run()
    assert d.m.phase is RoundState.AGGREGATING and len(d.m.result.counted) == 4


def test_malformed_vector_drops_only_that_device():
    def tamper(device, p):
        if device == 103 and isinstance(p, secagg_pb2.MaskedInput):
            p.masked_vector = p.masked_vector[:-4]
            p.length -= 1
        return p

    d = Driver(n=5, tamper=tamper)
    d.run()
    assert d.m.phase is RoundState.AGGREGATING
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
    assert d.m.phase is RoundState.AGGREGATING and 106 not in d.m.result.counted
    assert np.array_equal(d.m.result.encoded_sum, d.expected_sum())


def test_secagg_check_failure_drops_the_device():
    def tamper(device, p):  # a signature where none is expected: secagg drops the sender
        if device == 100 and isinstance(p, secagg_pb2.AdvertiseKeys):
            p.signature = b"s" * 64
        return p

    d = Driver(n=5, tamper=tamper)
    d.run()
    assert d.notices[100] == [P.ABORT_REASON_PROTOCOL_VIOLATION]
    assert d.m.phase is RoundState.AGGREGATING and 100 not in d.m.result.counted


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
    assert d2.m.phase is RoundState.AGGREGATING and 112 not in d2.m.result.counted


def test_device_lost_and_client_abort_are_dropouts():
    d = Driver(n=6)
    d.apply(d.m.device_lost(100, 0.0, "disconnected"))
    withdraw = P.AbortNotice(session_id=SESSION, round_number=7, device_id=103, reason=P.ABORT_REASON_CLIENT_LEAVING)
    d.apply(d.m.handle(103, withdraw, 0.0))
    d.run()
    assert d.m.phase is RoundState.AGGREGATING
    assert set(d.m.result.counted) == {106, 109, 112, 115}
    assert d.m.dropouts["advertise_keys"] == {100: "disconnected", 103: "client_abort:client_leaving"}
    assert d.notices[100] == [] and d.notices[103] == []


def test_cancel_tells_every_live_device():
    d = Driver(n=4)
    d.feed()
    d.apply(d.m.tick(0.0))
    d.apply(d.m.cancel(P.ABORT_REASON_COORDINATOR_SHUTDOWN, "shutting down", 1.0))
    assert d.m.phase is RoundState.ABORTED
    assert all(P.ABORT_REASON_COORDINATOR_SHUTDOWN in v for v in d.notices.values())
    assert d.ended[-1].reason == P.ABORT_REASON_COORDINATOR_SHUTDOWN
    assert d.m.cancel(P.ABORT_REASON_COORDINATOR_SHUTDOWN, "again", 2.0) == []


def test_commit_failure_aborts():
    d = Driver(n=4)
    d.run()
    actions = d.m.commit_failed("disk full", 5.0)
    assert d.m.phase is RoundState.ABORTED and any(isinstance(a, RoundEnded) and not a.committed for a in actions)
    with pytest.raises(RuntimeError):
        d.m.committed(1, 6.0)


IMPLICIT = ("devices", "examples", "update_norm", "clipped", "val_sampled_hits@10", "val_sampled_ndcg@10",
            "val_sampled_count")
EXPLICIT = ("devices", "examples", "update_norm", "val_sse", "val_sae", "val_rating_count")


def plain_totals(layout, devices, round_number):
    """What the counted devices' own metric values sum to, in the layout's units (the oracle)."""
    per = [fake_metric_values(d, round_number) for d in devices]
    return {n: sum(SLOTS[n].units(v[n]) for v in per) for n in layout.names}


def decoded_units(layout, result):
    sums, counts = layout.decode(result.metric_sums, len(result.counted))
    return {**counts, **{k: round(v / REAL_UNIT) for k, v in sums.items()}}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(3, 9),
    names=st.sampled_from([IMPLICIT, EXPLICIT, ("devices",)]),
    drops=st.lists(st.sampled_from([None] * 8 + ["advertise_keys", "share_keys", "masked_input", "unmasking"]),
                   min_size=9, max_size=9),
)
def test_metric_totals_are_exactly_the_counted_devices_sums_under_dropouts(n, names, drops):
    """The metric totals the coordinator decodes equal, unit for unit, the sums of the
    metric values of exactly the devices in the aggregate (U3): a device dropped
    before its masked input adds nothing, one dropped after it is counted whole, and
    the model update's coordinates stay the exact sum of the same devices."""
    cohort = [100 + 3 * i for i in range(n)]
    silent = {d: s for d, s in zip(cohort, drops) if s is not None}
    d = Driver(n=n, silent=silent, metric_names=names)
    d.run()
    event(f"outcome: {d.m.phase.value}")
    if d.m.phase is not RoundState.AGGREGATING:  # too many dropouts: the round aborts, nothing is decoded
        assert d.m.phase is RoundState.ABORTED and d.m.result is None
        return
    counted = d.m.result.counted
    event(f"counted {'<' if len(counted) < n else '='} cohort")
    assert set(counted) == {x for x in cohort if silent.get(x) not in ("advertise_keys", "share_keys", "masked_input")}
    assert np.array_equal(d.m.result.encoded_sum, d.expected_sum())
    assert decoded_units(d.layout, d.m.result) == plain_totals(d.layout, counted, 7)
    assert d.m.result.decoded_sum.shape == (12,)  # the model part only


def test_a_hostile_devices_metric_limbs_never_touch_the_model_update():
    """Out-of-range limbs (all ones, huge) from one device: the model coordinates of the
    sum are still exactly the counted devices' encoded updates, and the metric
    totals are refused as out of range."""
    hostile = {103: lambda view: np.full(view.metrics.coordinates, 0xFFFFFFFF, dtype=np.uint32)}
    d = Driver(n=5, metric_names=IMPLICIT, metric_limbs=hostile)
    d.run()
    assert d.m.phase is RoundState.AGGREGATING and 103 in d.m.result.counted
    L = 12
    want = np.stack([np.asarray(d.devices[x].encoded)[:L] for x in d.m.result.counted]).sum(axis=0, dtype=np.uint64)
    assert np.array_equal(d.m.result.encoded_sum[:L], want.astype(np.uint32))
    with pytest.raises(MetricRangeError):
        d.layout.decode(d.m.result.metric_sums, len(d.m.result.counted))


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
