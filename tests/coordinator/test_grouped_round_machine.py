"""A round in groups over the coordinator's pure machines (D99): fake
devices get their group's RoundTask through the wire, and the committed sum
is checked against an independent oracle, the plaintext sum of the counted
devices' encoded inputs, bit for bit, under every dropout pattern drawn."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.grouped_rounds import Grouped, GroupedRoundMachine, cohort_config, combine_group_sums
from coordinator.round_groups import groups_by_host
from coordinator.rounds import AggregateReady, Broadcast, LogEvent, PhaseChanged, RoundEnded, Send
from coordinator.store import RoundState
from fedmask_proto.v1 import common_pb2
from secagg.config import SecAggConfig
from secagg.grouped_round import combine_groups, group_configs, run_grouped_round
from secagg.groups import group_session_id, partition_seed
from secagg.inprocess import DropoutPlan
from wire import RoundIds, build_round_task, parse_round_task
from wire.round_metrics import MetricLayout

from coordinator_fakes import FakeDevice

P = common_pb2
DEADLINES = {s: 10.0 for s in ("advertise_keys", "share_keys", "share_check", "masked_input", "consistency_check",
                                "unmasking")}
SESSION = b"0123456789abcdef"
STAGES = ("advertise_keys", "share_keys", "share_check", "masked_input", "unmasking")


class GroupDriver:
    """Builds the groups' configs as the coordinator does, hands every fake
    device its group's task through the wire, and routes messages."""

    def __init__(self, n: int, group_size: int, *, silent: dict[int, str] | None = None, number: int = 3,
                 L: int = 9, minimum: int = 2, neighbors: int | str = "all", hosts: dict[int, int] | None = None):
        self.now = 0.0
        cohort = [10 + 7 * i for i in range(n)]
        groups = groups_by_host(cohort, hosts or {}, group_size=group_size, seed=partition_seed(SESSION, number))
        whole = SecAggConfig.create(num_clients=n, vector_length=L, session_id=SESSION)
        self.layout = MetricLayout.for_round(("devices", "examples"), whole.encoding)
        length = L + self.layout.coordinates
        self.configs = [
            SecAggConfig.create(num_clients=len(g), vector_length=length, session_id=group_session_id(SESSION, j),
                                encoding_clients=n, neighbors=neighbors if len(g) > 4 else "all")
            for j, g in enumerate(groups)
        ]
        self.m = GroupedRoundMachine(number=number, configs=self.configs, groups=groups, deadlines=DEADLINES,
                                     minimum=minimum, metrics=self.layout)
        self.devices = {d: FakeDevice(d, seed=5, silent_at=(silent or {}).get(d)) for d in cohort}
        self.notices: dict[int, list[int]] = {d: [] for d in cohort}
        self.phases: list[RoundState] = []
        self.ended: list[RoundEnded] = []
        self.ready: list[AggregateReady] = []
        self.logs: list[LogEvent] = []
        self.inbox: list[tuple[int, object]] = []
        for machine in self.m.machines:
            ids = RoundIds.from_cohort(machine.cohort)
            for d in machine.cohort:
                task = build_round_task(config=machine.config, round_number=number, ids=ids, devices=[d],
                                        model_name="synthetic", model_version=1,
                                        global_parameters={"mean": np.zeros(L, np.float32)}, metrics=self.layout)
                view = parse_round_task(task, hosted=[d])  # the device rebuilds its group's config from the wire
                assert view.config == machine.config
                self.inbox += [(d, p) for p in self.devices[d].on_task(view)]
        self.apply(self.m.start(self.now))

    def apply(self, actions):
        for a in actions:
            if isinstance(a, Send):
                inner = getattr(a.message, a.message.WhichOneof("message"))
                if isinstance(inner, P.AbortNotice):
                    self.notices[a.device_id].append(inner.reason)
                self.inbox += [(a.device_id, p) for p in self.devices[a.device_id].on_message(inner)]
            elif isinstance(a, Broadcast):
                pass
            elif isinstance(a, RoundEnded):
                self.ended.append(a)
            elif isinstance(a, PhaseChanged):
                self.phases.append(a.phase)
            elif isinstance(a, AggregateReady):
                self.ready.append(a)
            elif isinstance(a, LogEvent):
                self.logs.append(a)

    def run(self, max_steps: int = 30) -> None:
        for _ in range(max_steps):
            while self.inbox:
                d, p = self.inbox.pop(0)
                self.apply(self.m.handle(d, p, self.now))
            if not self.m.phase.is_collecting:
                return
            if not self.m.wants_close:
                self.now = self.m.deadline
            self.apply(self.m.tick(self.now))
        raise AssertionError("round did not end")

    def oracle(self, counted) -> np.ndarray:
        """The plaintext sum of the counted devices' encoded inputs mod 2^w."""
        total = np.stack([self.devices[d].encoded for d in counted]).sum(axis=0, dtype=np.uint64)
        return (total % np.uint64(1 << self.configs[0].encoding.modulus_bits)).astype(np.uint32)


def test_honest_round_in_three_groups_sums_exactly_and_decodes_once() -> None:
    d = GroupDriver(n=31, group_size=10)
    assert d.m.config.groups == 3 and min(d.m.config.sizes) >= 10
    d.run()
    assert d.m.phase is RoundState.AGGREGATING
    assert len(d.ready) == 1 and d.ready[0].result is d.m.result
    assert set(d.m.result.counted) == set(d.m.cohort)
    assert np.array_equal(d.m.result.encoded_sum, d.oracle(d.m.result.counted))
    mean = np.mean([d.devices[x].update for x in d.m.cohort], axis=0)
    assert np.allclose(d.m.result.decoded_mean, mean, atol=1e-6)
    # one phase per stage, as a round of one instance shows it
    assert d.phases == [RoundState.ADVERTISE_KEYS, RoundState.SHARE_KEYS, RoundState.SHARE_CHECK,
                        RoundState.MASKED_INPUT, RoundState.UNMASKING, RoundState.AGGREGATING]
    actions = d.m.committed(42, d.now)
    d.apply(actions)
    assert d.m.phase is RoundState.COMMITTED and d.ended == [RoundEnded(True)]
    # every group tells its own devices, with its own session id
    sessions = {a.message.round_committed.session_id for a in actions if isinstance(a, Broadcast)}
    assert sessions == {c.session_id for c in d.configs}


def test_a_group_that_aborts_leaves_the_others_counted() -> None:
    """Every device but one of group 0 goes silent at masked input: that
    group aborts, its devices are told, and the round commits the others'
    sum exactly, with no device of group 0 in it."""
    probe = GroupDriver(n=30, group_size=10)
    g0 = probe.m.groups[0]
    d = GroupDriver(n=30, group_size=10, silent={x: "masked_input" for x in g0[1:]})
    d.run()
    assert d.m.phase is RoundState.AGGREGATING
    assert not set(d.m.result.counted) & set(g0)
    assert set(d.m.result.counted) == set(d.m.cohort) - set(g0)
    assert np.array_equal(d.m.result.encoded_sum, d.oracle(d.m.result.counted))
    assert any(e.event == "group_aborted" and e.fields["group"] == 0 for e in d.logs)
    # the record counts what the sum counts: group 0 is among the dropouts, not the survivors
    assert set(d.m.survivors()["masked_input"]) == set(d.m.result.counted)
    assert d.m.dropouts["masked_input"][g0[0]] == "group_aborted"
    assert not any(e.event == "round_aborted" for e in d.logs)
    assert P.ABORT_REASON_TOO_FEW_SURVIVORS in d.notices[g0[0]]


def test_too_few_counted_over_the_groups_aborts_the_round_and_tells_the_counted() -> None:
    probe = GroupDriver(n=20, group_size=10)
    g0, g1 = probe.m.groups
    d = GroupDriver(n=20, group_size=10, silent={x: "share_keys" for x in g0}, minimum=15)
    d.run()
    assert d.m.phase is RoundState.ABORTED
    assert d.ended and d.ended[-1].committed is False and "minimum 15" in d.m.abort_detail
    assert all(P.ABORT_REASON_TOO_FEW_SURVIVORS in d.notices[x] for x in g1)  # the counted group was told


def test_every_group_aborting_aborts_the_round_once() -> None:
    d = GroupDriver(n=20, group_size=10, silent={10 + 7 * i: "advertise_keys" for i in range(20)})
    d.run()
    assert d.m.phase is RoundState.ABORTED
    assert sum(1 for e in d.ended if not e.committed) == 1
    assert sum(1 for e in d.logs if e.event == "round_aborted") == 1


def test_a_host_is_never_split_and_groups_stay_at_least_g() -> None:
    hosts = {10 + 7 * i: i // 6 for i in range(40)}  # 7 hosts of 6 devices (the last of 4)
    d = GroupDriver(n=40, group_size=12, hosts=hosts)
    for g in d.m.groups:
        assert len(g) >= 12
        for x in g:
            assert {y for y in d.m.cohort if hosts[y] == hosts[x]} <= set(g)
    d.run()
    assert np.array_equal(d.m.result.encoded_sum, d.oracle(d.m.result.counted))


def test_machine_refuses_groups_without_the_one_encoding() -> None:
    a = SecAggConfig.create(num_clients=3, vector_length=4, session_id=b"a", encoding_clients=6)
    b = SecAggConfig.create(num_clients=3, vector_length=4, session_id=b"b")  # sized for its group only
    with pytest.raises(ValueError, match="one encoding"):
        GroupedRoundMachine(number=1, configs=[a, b], groups=[[1, 2, 3], [4, 5, 6]], deadlines=DEADLINES, minimum=2)
    with pytest.raises(ValueError, match="session id"):
        GroupedRoundMachine(number=1, configs=[a, dataclasses.replace(a)], groups=[[1, 2, 3], [4, 5, 6]],
                            deadlines=DEADLINES, minimum=2)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(8, 36), group_size=st.integers(4, 12), data=st.data())
def test_any_dropout_pattern_commits_the_exact_sum_or_aborts(n: int, group_size: int, data: st.DataObject) -> None:
    """Property: whatever devices go silent at whatever stage, the round
    either aborts or commits the plaintext sum of exactly the devices it
    counts, each counted device in one group, none that went silent before
    its masked input was sent."""
    cohort = [10 + 7 * i for i in range(n)]
    silent = data.draw(st.dictionaries(st.sampled_from(cohort), st.sampled_from(STAGES), max_size=n // 2))
    d = GroupDriver(n=n, group_size=group_size, silent=silent, neighbors=4)
    d.run()
    assert d.m.phase in (RoundState.AGGREGATING, RoundState.ABORTED)
    if d.m.phase is RoundState.ABORTED:
        assert d.m.result is None
        return
    counted = d.m.result.counted
    assert len(counted) == len(set(counted)) >= 2
    early = {x for x, s in silent.items() if STAGES.index(s) <= STAGES.index("masked_input")}
    assert not set(counted) & early
    assert set(d.m.survivors()["masked_input"]) == set(counted)  # the record's counted set is the sum's
    per_group = [set(counted) & set(g) for g in d.m.groups]
    assert sum(len(s) for s in per_group) == len(counted)
    assert np.array_equal(d.m.result.encoded_sum, d.oracle(counted))


def test_an_aborting_round_in_groups_is_charged_group_by_group() -> None:
    """A round whose groups' sums were reconstructed but not committed (a
    failed commit) is charged as released (D94), each group at the noise its
    own devices split (D99), the round at the least of them: here a group of
    10 that counted 9 (z sqrt(9/10)) beside full ones."""
    from coordinator.interrupted_charge import abort_charge
    from coordinator.round_report import PrivacyLedger
    from coordinator.settings import DpSettings
    from coordinator.store import InMemoryStore

    probe = GroupDriver(n=30, group_size=10)
    d = GroupDriver(n=30, group_size=10, silent={probe.m.groups[1][0]: "masked_input"})
    d.run()
    assert d.m.phase is RoundState.AGGREGATING
    d.apply(d.m.commit_failed("the store went away", d.now))
    assert d.m.phase is RoundState.ABORTED
    ledger = PrivacyLedger(DpSettings(mode="distributed", mechanism="gaussian-float", noise_multiplier=1.0, clip=0.1),
                           InMemoryStore())
    entry = abort_charge(ledger, d.m, [])
    assert entry is not None
    assert sorted((g.size, g.counted) for g in entry.groups) == [(10, 9), (10, 10), (10, 10)]
    assert entry.noise_multiplier == pytest.approx(0.9 ** 0.5)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(8, 30), group_size=st.integers(4, 10), data=st.data())
def test_the_groups_sums_combine_to_the_rounds_result_and_any_of_them_to_their_plaintext_sum(
        n: int, group_size: int, data: st.DataObject) -> None:
    """Property: `combine_group_sums` over the groups the round added gives
    the machine's own result bit for bit; over any subset of the groups
    whose sums were reconstructed, the plaintext sum of exactly their
    counted devices' encoded inputs, decoded once (within one quantization
    step of the devices' mean update)."""
    cohort = [10 + 7 * i for i in range(n)]
    silent = data.draw(st.dictionaries(st.sampled_from(cohort), st.sampled_from(STAGES), max_size=n // 3))
    d = GroupDriver(n=n, group_size=group_size, silent=silent, neighbors=4)
    d.run()
    assert isinstance(d.m, Grouped) and not any(isinstance(m, Grouped) for m in d.m.machines)
    released = [m.result for m in d.m.released() if m.result is not None]
    if d.m.result is not None:
        own = combine_group_sums(d.m.whole, released, metrics=d.layout)
        assert own.counted == d.m.result.counted
        for field in ("encoded_sum", "decoded_sum", "decoded_mean", "metric_sums"):
            assert np.array_equal(getattr(own, field), getattr(d.m.result, field)), field
    if not released:
        return
    chosen = data.draw(st.lists(st.sampled_from(range(len(released))), min_size=1, unique=True))
    part = combine_group_sums(d.m.whole, [released[i] for i in chosen], metrics=d.layout)
    counted = sorted(x for i in chosen for x in released[i].counted)
    assert part.counted == tuple(counted)
    expected = d.oracle(counted)
    assert np.array_equal(part.encoded_sum, expected)
    length = d.m.whole.vector_length - d.layout.coordinates
    assert np.array_equal(part.metric_sums, expected[length:])
    mean = np.mean([d.devices[x].update for x in counted], axis=0)
    assert np.allclose(part.decoded_mean, mean, rtol=0.0, atol=d.m.whole.encoding.step)


@dataclass(frozen=True)
class PositionSum:
    """A group's sum from secagg's in-process round, its counted devices named by cohort position."""

    encoded_sum: np.ndarray
    counted: Sequence[int]


def test_combining_any_groups_sums_matches_secaggs_in_process_round_in_groups() -> None:
    """Independent oracle: secagg's own round in groups (`run_grouped_round`,
    real instances, one per group). Over every subset of the groups that
    committed, `combine_group_sums` equals `secagg.grouped_round.combine_groups`
    over the same groups bit for bit (sum, decoding, counted set), and a
    part of the cohort run on its own (`positions`, `first_group`, as a rank
    of a distributed round runs its groups) adds to the same sum."""
    n, length = 16, 6
    groups = ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15))
    configs = group_configs(groups, session_id=SESSION, vector_length=length, clip=0.5)
    inputs = np.random.default_rng(11).uniform(-0.6, 0.6, (n, length))  # some coordinates clip
    plan = DropoutPlan(advertise_keys=frozenset({0, 1, 2}), masked_input=frozenset({9}))  # group 0 aborts
    out = run_grouped_round(inputs, groups=groups, configs=configs, dropouts=plan, seed=7)
    whole = cohort_config(configs[0], n)
    sums = {j: PositionSum(o.encoded_sum, tuple(groups[j][i] for i in o.counted))
            for j, o in enumerate(out.outcomes) if o.ok and o.encoded_sum is not None}
    assert sorted(sums) == [1, 2, 3] and 9 not in sums[2].counted
    for k in range(1, len(sums) + 1):
        for subset in itertools.combinations(sorted(sums), k):
            got = combine_group_sums(whole, [sums[j] for j in subset])
            want = combine_groups(out.encoding, tuple(groups[j] for j in subset),
                                  tuple(out.outcomes[j] for j in subset), {})
            assert want.exact and want.encoded_sum is not None and want.sum is not None and want.mean is not None
            assert got.counted == want.counted
            assert np.array_equal(got.encoded_sum, want.encoded_sum)
            assert np.array_equal(got.decoded_sum, want.sum)
            assert np.array_equal(got.decoded_mean, want.mean)

    rows = [p for g in groups[2:] for p in g]  # groups 2 and 3 as a part of the cohort
    local = tuple(tuple(rows.index(p) for p in g) for g in groups[2:])
    part_plan = DropoutPlan(masked_input=frozenset({rows.index(9)}))
    part = run_grouped_round(inputs[rows], groups=local, configs=configs[2:], dropouts=part_plan, seed=7,
                             positions=rows, first_group=2)
    assert part.ok and part.encoded_sum is not None and part.sum is not None
    both = combine_group_sums(whole, [sums[2], sums[3]])
    assert both.counted == tuple(sorted(rows[i] for i in part.counted))
    assert np.array_equal(both.encoded_sum, part.encoded_sum)
    assert np.array_equal(both.decoded_sum, part.sum)


def test_combining_refuses_no_sums_and_a_device_counted_twice() -> None:
    whole = cohort_config(SecAggConfig.create(num_clients=2, vector_length=3, session_id=b"g", encoding_clients=4), 4)
    one = PositionSum(np.ones(3, np.uint32), (1, 2))
    with pytest.raises(ValueError, match="no group sum"):
        combine_group_sums(whole, [])
    with pytest.raises(ValueError, match="counted in two"):
        combine_group_sums(whole, [one, PositionSum(np.ones(3, np.uint32), (2, 3))])
