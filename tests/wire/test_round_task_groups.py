"""The RoundTask's secagg settings and a round in groups (D87, D99): a
group's config travels with the cohort size its encoding is sized for, and
a device rebuilds it field for field."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from secagg.config import SecAggConfig
from secagg.encoding import FixedPointEncoding
from wire.errors import WireError
from wire.round_task import encoding_cohort_size, secagg_config_from_proto, secagg_settings_to_proto


def test_one_instance_round_trips_with_its_own_size() -> None:
    whole = SecAggConfig.create(num_clients=10, vector_length=3, session_id=b"s")
    settings = secagg_settings_to_proto(whole)
    assert settings.encoding_cohort_size == 10
    assert secagg_config_from_proto(settings, b"s") == whole


@given(group=st.integers(2, 300), extra=st.integers(0, 100_000), bits=st.sampled_from([20, 24, 32]),
       clip=st.sampled_from([0.5, 1.0, 3.0]))
def test_a_group_config_round_trips_at_the_cohorts_scale(group: int, extra: int, bits: int, clip: float) -> None:
    """Whatever the cohort (>= the group), the device rebuilds the same
    config: the same max_level, hence the same encoded values, as every
    other group of the round."""
    cohort = group + extra
    cfg = SecAggConfig.create(num_clients=group, vector_length=3, session_id=b"s", encoding_clients=cohort,
                              modulus_bits=bits, clip=clip)
    settings = secagg_settings_to_proto(cfg)
    assert settings.encoding_cohort_size >= cohort
    rebuilt = secagg_config_from_proto(settings, b"s")
    assert rebuilt == cfg
    assert rebuilt.encoding.max_level == FixedPointEncoding.for_cohort(cohort, clip=clip, modulus_bits=bits).max_level


def test_an_encoding_size_below_the_group_is_refused_by_the_device() -> None:
    """A coordinator that sized the encoding for fewer devices than the
    instance has would let the sum wrap: the device refuses the task."""
    cfg = SecAggConfig.create(num_clients=10, vector_length=3, session_id=b"s")
    settings = secagg_settings_to_proto(cfg)
    settings.encoding_cohort_size = 9
    with pytest.raises(WireError, match="below cohort_size"):
        secagg_config_from_proto(settings, b"s")


def test_absent_encoding_size_means_the_cohort() -> None:
    cfg = SecAggConfig.create(num_clients=7, vector_length=3, session_id=b"s")
    settings = secagg_settings_to_proto(cfg)
    settings.ClearField("encoding_cohort_size")
    assert secagg_config_from_proto(settings, b"s") == cfg


def test_an_encoding_no_cohort_gives_cannot_be_sent() -> None:
    cfg = SecAggConfig.create(num_clients=10, vector_length=3, session_id=b"s", modulus_bits=20)
    # floor((2^20 - 1) / N) is 104,857 for N = 10 and 95,325 for N = 11: no N gives 104,856
    bad = FixedPointEncoding(cfg.encoding.clip, 10, 20, ((1 << 20) - 1) // 10 - 1)
    assert encoding_cohort_size(cfg) == 10
    with pytest.raises(WireError, match="cannot be sent"):
        secagg_settings_to_proto(SecAggConfig(10, 3, b"s", cfg.degree, cfg.threshold, bad, False))
