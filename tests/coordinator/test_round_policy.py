"""The round policy: adaptive stage deadlines (D21), round windows, DP settings."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.round_policy import AdaptiveDeadlines, dp_settings_for, metric_names_for, quantile, round_windows
from coordinator.settings import DeadlineSettings, DpSettings
from fedmask_proto.v1 import session_pb2
from secagg.stages import Stage

BOUNDS = DeadlineSettings(training=1.0, advertise_keys=5.0, share_keys=5.0, share_check=5.0, masked_input=5.0,
                          consistency_check=5.0, unmasking=5.0, floor=0.25, margin=1.5, slack=0.25)


def test_starts_at_the_configured_deadlines_the_safe_default() -> None:
    d = AdaptiveDeadlines(BOUNDS)
    assert d.deadlines() == {Stage.ADVERTISE_KEYS: 6.0, Stage.SHARE_KEYS: 5.0, Stage.SHARE_CHECK: 5.0, Stage.MASKED_INPUT: 5.0,
                             Stage.CONSISTENCY_CHECK: 5.0, Stage.UNMASKING: 5.0}


def test_learns_margin_times_quantile_plus_slack_per_stage() -> None:
    d = AdaptiveDeadlines(BOUNDS)
    d.observe({"masked_input": 1.0, "share_keys": 0.5})
    d.observe({"masked_input": 1.2})
    assert d.deadline(Stage.MASKED_INPUT) == pytest.approx(1.5 * quantile([1.0, 1.2], 0.95) + 0.25)
    assert d.deadline(Stage.SHARE_KEYS) == pytest.approx(1.5 * 0.5 + 0.25)
    assert d.deadline(Stage.UNMASKING) == 5.0  # nothing seen: the ceiling


def test_clamped_to_floor_and_ceiling() -> None:
    d = AdaptiveDeadlines(BOUNDS)
    d.observe({"unmasking": 0.0, "masked_input": 100.0})
    assert d.deadline(Stage.UNMASKING) == BOUNDS.floor
    assert d.deadline(Stage.MASKED_INPUT) == BOUNDS.masked_input


def test_a_hit_deadline_recovers_upwards() -> None:
    """An honest device late by the deadline makes the completion time equal
    the deadline; the next deadline is then margin x that + slack, larger."""
    d = AdaptiveDeadlines(BOUNDS)
    d.observe({"masked_input": 0.5})
    first = d.deadline(Stage.MASKED_INPUT)
    d.observe({"masked_input": first})
    assert d.deadline(Stage.MASKED_INPUT) > first


def test_window_forgets_old_rounds() -> None:
    d = AdaptiveDeadlines(BOUNDS.model_copy(update={"window": 2}))
    d.observe({"masked_input": 3.0})
    d.observe({"masked_input": 1.0})
    d.observe({"masked_input": 1.0})
    assert d.deadline(Stage.MASKED_INPUT) == pytest.approx(1.5 * 1.0 + 0.25)


def test_fixed_policy_ignores_observations() -> None:
    d = AdaptiveDeadlines(BOUNDS.model_copy(update={"policy": "fixed"}))
    d.observe({"masked_input": 0.1})
    assert d.deadline(Stage.MASKED_INPUT) == 5.0


def test_ignores_unknown_names_and_non_finite_times() -> None:
    d = AdaptiveDeadlines(BOUNDS)
    d.observe({"aggregating": 0.1, "masked_input": math.nan, "share_keys": -1.0})
    assert d.deadlines()[Stage.MASKED_INPUT] == 5.0 and d.deadlines()[Stage.SHARE_KEYS] == 5.0


def test_windows_split_training_from_stage_zero() -> None:
    d = AdaptiveDeadlines(BOUNDS)
    d.observe({"advertise_keys": 1.2})
    w = d.windows(active=False)
    learnt = 1.5 * 1.2 + 0.25
    assert w.machine["advertise_keys"] == pytest.approx(learnt)
    assert w.task["advertise_keys"] == pytest.approx(learnt)  # training + advertising, as announced
    assert "consistency_check" not in w.task
    assert "consistency_check" in d.windows(active=True).task


def test_plaintext_has_one_stage_that_includes_training() -> None:
    d = AdaptiveDeadlines(BOUNDS, plaintext=True)
    w = d.windows(active=False)
    assert w.machine == {"masked_input": 6.0}
    assert w.task == {"advertise_keys": 1.0, "masked_input": 5.0}
    d.observe({"masked_input": 0.4})
    w = d.windows(active=False)
    assert w.machine == {"masked_input": pytest.approx(0.85)}
    assert w.task["advertise_keys"] + w.task["masked_input"] == pytest.approx(0.85)


def test_round_windows_of_fixed_deadlines() -> None:
    per_stage = dict.fromkeys(Stage, 2.0)
    w = round_windows(per_stage, training=10.0, plaintext=False, active=False)
    assert w.machine["advertise_keys"] == 12.0 and w.machine["unmasking"] == 2.0
    assert set(w.task) == {"advertise_keys", "share_keys", "share_check", "masked_input", "unmasking"}


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=40), st.floats(0, 1))
def test_quantile_matches_numpy(values: list[float], q: float) -> None:
    assert quantile(values, q) == pytest.approx(float(np.quantile(values, q)), rel=1e-9, abs=1e-9)


def test_dp_settings_split_the_noise_in_distributed_mode() -> None:
    # the float Gaussian's std (the discrete Gaussian's settings: tests/coordinator/test_dp_mechanism_wiring.py)
    dp = DpSettings(mode="distributed", mechanism="gaussian-float", clip=0.1, noise_multiplier=1.0)
    got = dp_settings_for(dp, 25)
    assert got.mode == session_pb2.DP_MODE_DISTRIBUTED and got.noise_stddev == pytest.approx(0.1 / 5)
    assert got.mechanism == session_pb2.DP_MECHANISM_GAUSSIAN_FLOAT
    assert dp_settings_for(DpSettings(mode="local", mechanism="gaussian-float"), 25).noise_stddev == pytest.approx(0.1)
    assert dp_settings_for(DpSettings(mode="none"), 25).mode == session_pb2.DP_MODE_NONE


def test_the_metrics_a_round_asks_for() -> None:
    model = ("devices", "examples")
    dp = DpSettings(mode="local", mechanism="gaussian-float", clip=0.1, noise_multiplier=1.0)
    assert metric_names_for(model, DpSettings(mode="none"), plaintext=False) == model
    assert metric_names_for(model, dp, plaintext=False) == (*model, "clipped")
    assert metric_names_for(model, dp, plaintext=True) == ()  # inputs in the clear: no metrics with them
    assert metric_names_for(model, dp, plaintext=False, enabled=False) == ()


def test_ceilings_grow_with_the_cohort_so_a_large_first_round_is_not_cut_short() -> None:
    d = AdaptiveDeadlines(BOUNDS.model_copy(update={"per_device": 0.005}))
    small, large = d.deadlines(100), d.deadlines(10_000)
    assert small[Stage.UNMASKING] == pytest.approx(5.0 + 0.5)
    assert large[Stage.UNMASKING] == pytest.approx(5.0 + 50.0)  # a first round at 10,000: +50 s per stage
    assert large[Stage.ADVERTISE_KEYS] == pytest.approx(6.0 + 50.0)
    d.observe({"unmasking": 30.0})  # what a 10,000-device round took
    assert d.deadline(Stage.UNMASKING, 10_000) == pytest.approx(1.5 * 30.0 + 0.25)  # learnt, within the ceiling
    assert d.deadline(Stage.UNMASKING, 100) == pytest.approx(5.5)  # capped by the small cohort's ceiling
    windows = d.windows(active=False, cohort=10_000)
    assert windows.machine[Stage.SHARE_KEYS] == pytest.approx(55.0)
