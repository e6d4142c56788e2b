"""Small pure pieces of the coordinator: secagg policy, message limits,
the model factory, debug checksums, settings additions."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.debug import debug_metrics, encoded_checksum
from coordinator.logs import format_event
from coordinator.model_host import ModelConfigError, SyntheticModel, build_server_model
from coordinator.round_policy import secagg_config_for
from coordinator.server import max_receive_message_bytes
from coordinator.settings import CoordinatorSettings, SettingsError


def settings(**over):
    return CoordinatorSettings.load(overrides=over)


@pytest.mark.parametrize(
    "over, n, complete, t",
    [
        ({"secagg.graph": "full", "secagg.threshold": "majority"}, 10, True, 6),
        ({"secagg.graph": "full"}, 10, True, 7),  # two_thirds: ceil(20/3)
        ({"secagg.graph": "full", "secagg.signatures": True, "secagg.threshold": "majority"}, 10, True, 7),  # 2n/3+1
        ({"secagg.graph": 4}, 20, False, 4),  # group of 5: ceil(10/3)=4
        ({"secagg.graph": 4}, 5, True, 4),  # K >= n-1: complete
        ({"secagg.graph": "auto"}, 8, True, 6),  # too small for SecAgg+: complete with the policy
        ({"secagg.graph": "auto"}, 100, False, None),  # secagg's own (k, t)
    ],
)
def test_secagg_policy(over, n, complete, t):
    cfg = secagg_config_for(settings(**over), n, 7, b"s" * 16)
    assert cfg.num_clients == n and cfg.vector_length == 7 and cfg.is_complete_graph == complete
    if t is not None:
        assert cfg.threshold == t
    assert cfg.threshold > (cfg.degree + 1) // 2  # a strict majority of every group


def test_odd_sparse_degree_is_refused():
    with pytest.raises(SettingsError, match="even"):
        settings(**{"secagg.graph": 5})


def test_receive_limit_fits_a_masked_input_and_large_cohorts():
    s = settings(**{"cohort.size": 1000})
    limit = max_receive_message_bytes(s, 53_824)
    assert limit >= 4 * 53_824 + 1024 and limit >= 1300 * 118 and limit >= 4 << 20
    big = max_receive_message_bytes(settings(), 4_000_000)
    assert big > 16_000_000
    assert max_receive_message_bytes(settings(max_receive_message_bytes=1 << 20), 10) == 1 << 20


def test_debug_record_sums_only_on_loopback():
    assert settings(**{"debug.record_sums": True}).debug.record_sums
    with pytest.raises(SettingsError, match="debug.record_sums"):
        settings(**{"debug.record_sums": True, "listen_address": "0.0.0.0:1", "auth.mode": "token", "auth.token": "x" * 20})


def test_encoded_checksum_is_exact_and_position_sensitive():
    a = np.array([1, 2, 3], dtype=np.uint32)
    assert encoded_checksum(a) == 1 + 4 + 9
    assert encoded_checksum(a[::-1].copy()) != encoded_checksum(a)
    big = np.full(100_000, 2**32 - 1, dtype=np.uint32)
    value = encoded_checksum(big)
    assert value == float((sum(range(1, 100_001)) * (2**32 - 1)) % 2**52)
    m = debug_metrics(a, np.array([0.5, -1.0, 2.0]), 3, 2)
    assert m["debug.sum[0]"] == 0.5 and m["debug.sum[1]"] == -1.0 and "debug.sum[2]" not in m


def test_model_factory():
    syn = build_server_model("synthetic", {"vector_length": 5})
    assert isinstance(syn, SyntheticModel) and syn.update_dim == 5
    assert syn.apply_mean(syn.init_parameters(0), np.ones(5), 0)["mean"].dtype == np.float32
    assert syn.n_items is None and syn.hyperparameters() == {"vector_length": 5}  # no catalogue: no top-k
    cat = build_server_model("synthetic", {"vector_length": 5, "n_items": 2})
    assert cat.n_items == 2 and cat.hyperparameters() == {"vector_length": 5, "n_items": 2}
    for name, hp, match in [
        ("synthetic", {}, "vector_length"),
        ("synthetic", {"vector_length": 0}, "vector_length"),
        ("synthetic", {"vector_length": 5, "n_items": 0}, "n_items"),
        ("synthetic", {"vector_length": 5, "k": 2}, "vector_length"),
        ("fedrap", {"n_items": 3}, "n_users"),
        ("nope", {"n_users": 2, "n_items": 3}, "unknown model"),
        ("fedrap", {"n_users": 2, "n_items": 3, "bogus": 1}, "bogus"),
    ]:
        with pytest.raises(ModelConfigError, match=match):
            build_server_model(name, hp)


def test_log_lines_are_key_value():
    assert format_event("x", {"a": 1, "b": "two words", "c": ""}) == "event=x a=1 b='two words' c=''"
