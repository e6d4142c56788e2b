"""The coordinator hosting FREIB for a cross-silo federation (coordinator/platform_model_host.py)."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.model_host import ModelConfigError, build_server_model

HP = {"n_users": 20, "n_items": 30, "n_levels": 5, "k": 4, "k_bias": 3, "mlp": [4]}


def test_freib_is_hosted_with_prototypes_in_its_global_state() -> None:
    from models.keyed_random import global_init_generator
    from models.platform_federation import platform_model_from_hyperparameters

    from coordinator.platform_model_host import PlatformServerModel

    server = build_server_model("freib", HP)
    assert isinstance(server, PlatformServerModel)
    params = server.init_parameters(7)
    model = platform_model_from_hyperparameters("freib", HP)
    want = model.init_shared(global_init_generator(7))  # simulate's initial state for seed 7
    for k, v in want.items():
        np.testing.assert_array_equal(params[k], v.numpy())
    assert params["proto"].shape == (5, 3) and params["proto_present"].sum() == 0
    assert server.update_dim == model.shared_dim() + 5 * (3 + 1)
    assert server.parameter_shapes() == {k: v.shape for k, v in params.items()}
    assert "val_sse" in server.metric_names and server.n_items == 30 and server.n_platforms == 5
    mean = np.zeros(server.update_dim)
    mean[-5:] = [0.2, 0.0, 0.4, 0.0, 1.0]  # presence flags: levels 0, 2, 4 seen by some platform
    out = server.apply_mean(params, mean, 0)
    assert out["proto_present"].tolist() == [1.0, 0.0, 1.0, 0.0, 1.0]
    for k in want:
        np.testing.assert_array_equal(out[k], params[k])  # a zero change leaves them


def test_bad_freib_hyperparameters_are_refused_by_name() -> None:
    with pytest.raises(ModelConfigError, match="n_levels"):
        build_server_model("freib", {"n_users": 20, "n_items": 30})
    with pytest.raises(ModelConfigError, match="n_platforms"):
        build_server_model("freib", {**HP, "n_platforms": 0})
    with pytest.raises(ModelConfigError, match="bad hyperparameter"):
        build_server_model("freib", {**HP, "tau": -1})
