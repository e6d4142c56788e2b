"""wire.dp_task: the RoundTask's discrete Gaussian (D88), built by the
coordinator and checked for meaning by the device.

Oracle: `dpmech.calibrate` (what the coordinator sent) and the device's
refusals of every field a hostile coordinator could bend."""

from __future__ import annotations

import dataclasses

import pytest

from dpmech.calibrate import calibrate
from fedmask_proto.v1 import session_pb2
from secagg.config import SecAggConfig
from wire import WireError, build_round_task, parse_round_task
from wire.dp_task import (GAUSSIAN_FLOAT, discrete_gaussian_settings, mechanism_name, rotation_seed,
                          task_mechanism, task_removable)
from wire.round_binding import task_digest, training_key
from wire.round_metrics import MetricLayout
from wire.ids import RoundIds

N, DIM = 6, 300


def _round(bits: int = 32) -> tuple[SecAggConfig, session_pb2.DpSettings]:
    mech = calibrate(dim=DIM, clip=0.5, noise_multiplier=1.0, devices=N, shares=N, bits=bits)
    config = SecAggConfig.create(num_clients=N, vector_length=mech.padded_dim, session_id=b"s" * 40,
                                 modulus_bits=bits)
    return config, discrete_gaussian_settings(mode=session_pb2.DP_MODE_DISTRIBUTED, noise_multiplier=1.0,
                                              mechanism=mech)


def test_the_device_rebuilds_the_coordinators_mechanism() -> None:
    config, dp = _round()
    mech = task_mechanism(dp, config, 0)
    want = calibrate(dim=DIM, clip=0.5, noise_multiplier=1.0, devices=N, shares=N, bits=32)
    assert mech == want and mechanism_name(dp) == "discrete-gaussian"
    task = build_round_task(config=config, round_number=3, ids=RoundIds.from_cohort(list(range(1, N + 1))),
                            devices=[1], model_name="synthetic", model_version=1,
                            global_parameters={}, dp=dp)
    view = parse_round_task(task)
    assert view.mechanism == want and view.update_length == DIM
    assert view.rotation_seed == rotation_seed(config.session_id) != rotation_seed(b"other")
    float_dp = session_pb2.DpSettings(mode=session_pb2.DP_MODE_LOCAL, clip_norm=0.1, noise_stddev=0.1)
    assert task_mechanism(float_dp, config, 0) is None and mechanism_name(float_dp) == GAUSSIAN_FLOAT


@pytest.mark.parametrize(("field", "value", "why"), [
    ("noise_variance_denominator", 0, "positive fraction"),
    ("noise_variance_numerator", 0, "positive fraction"),
    ("scale", float("nan"), "scale and clip"),
    ("clip_norm", -1.0, "scale and clip"),
    ("noise_multiplier", 0.0, "multiplier"),
    ("update_length", 0, "out of range"),
    ("update_length", DIM * 2, "masked as"),
    ("noise_variance_denominator", 10**12, "sigma2"),  # sigma^2 far below the bound's 1/4
    ("mechanism", 7, "unknown"),
])
def test_the_device_refuses_what_cannot_be_right(field: str, value: object, why: str) -> None:
    config, dp = _round()
    setattr(dp, field, value)
    with pytest.raises(WireError, match=why):
        task_mechanism(dp, config, 0)


def test_the_device_refuses_a_field_too_small_and_metric_coordinates() -> None:
    config, dp = _round()
    small = dataclasses.replace(config, encoding=dataclasses.replace(config.encoding, modulus_bits=12,
                                                                     max_level=(2**12 - 1) // N))
    with pytest.raises(WireError, match="too small"):
        task_mechanism(dp, small, 0)
    with pytest.raises(WireError, match="no metric coordinates"):
        task_mechanism(dp, config, MetricLayout.for_round(("devices",), config.encoding).coordinates)


def test_the_session_id_commits_to_the_share_and_the_training_key_does_not() -> None:
    config, dp = _round()
    ids = RoundIds.from_cohort(list(range(1, N + 1)))

    def task(settings: session_pb2.DpSettings) -> session_pb2.RoundTask:
        return build_round_task(config=config, round_number=1, ids=ids, devices=[1], model_name="synthetic",
                                model_version=1, global_parameters={}, dp=settings)

    other = session_pb2.DpSettings()
    other.CopyFrom(dp)
    other.noise_variance_numerator += 1
    assert task_digest(task(dp)) != task_digest(task(other))
    assert training_key(task(dp)) == training_key(task(other))
    float_dp = session_pb2.DpSettings()
    float_dp.CopyFrom(dp)
    float_dp.mechanism = session_pb2.DP_MECHANISM_GAUSSIAN_FLOAT
    assert training_key(task(dp)) == training_key(task(float_dp))  # no second contribution by switching mechanism


def test_a_removable_noise_task_round_trips_and_is_refused_without_the_distributed_discrete_gaussian() -> None:
    """SecaggSettings.removable_noise (D110): the device rebuilds the group's
    components (component 0 is the mechanism's share) and the sealed blob's
    size; it refuses the flag with local noise or without the mechanism."""
    mech = calibrate(dim=DIM, clip=0.5, noise_multiplier=1.0, devices=N, shares=N, bits=32)
    config = SecAggConfig.create(num_clients=N, vector_length=mech.padded_dim, session_id=b"s" * 40, threshold=4,
                                 removable_noise=True)
    dp = discrete_gaussian_settings(mode=session_pb2.DP_MODE_DISTRIBUTED, noise_multiplier=1.0, mechanism=mech)
    task = build_round_task(config=config, round_number=3, ids=RoundIds.from_cohort(list(range(1, N + 1))),
                            devices=[1], model_name="synthetic", model_version=1, global_parameters={}, dp=dp)
    view = parse_round_task(task)
    assert view.config.removable_noise and view.ids.components == 2
    assert view.removable is not None and view.removable.variances[0] == mech.sigma2
    assert task_removable(dp, dataclasses.replace(config, removable_noise=False), mech) is None
    local = discrete_gaussian_settings(mode=session_pb2.DP_MODE_LOCAL, noise_multiplier=1.0, mechanism=mech)
    with pytest.raises(WireError, match="removable noise needs"):
        task_removable(local, config, mech)
    with pytest.raises(WireError, match="removable noise needs"):
        task_removable(dp, config, None)
    bad = session_pb2.RoundTask()
    bad.CopyFrom(task)
    bad.dp.mode = session_pb2.DP_MODE_LOCAL
    with pytest.raises(WireError, match="removable noise needs"):
        parse_round_task(bad)
