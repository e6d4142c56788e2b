"""FREIB's global state across processes: packing, the coordinator's server step, hyper-parameters."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from models.freib import PlatformModel, server_step
from models.platform_federation import (
    PlatformHyperparameterError,
    pack_global,
    platform_model_from_hyperparameters,
    server_apply,
    unpack_global,
)

HP = {"n_users": 6, "n_items": 7, "n_levels": 3, "k": 4, "k_bias": 3, "mlp": [4]}


def model() -> PlatformModel:
    return platform_model_from_hyperparameters("freib", HP)


def test_hyperparameters_build_the_tuned_model_with_overrides() -> None:
    m = model()
    assert (m.n_users, m.n_items, m.n_levels, m.k, m.mlp) == (6, 7, 3, 4, (4,))
    from models.platforms import model_defaults

    tuned = model_defaults("freib")  # the tuned defaults of models/platforms.py (D79)
    assert (m.lr, m.local_epochs, m.batch_size, m.backbone) == (tuned["lr"], tuned["local_epochs"], tuned["batch_size"], "ncf")
    assert platform_model_from_hyperparameters("freib", {**HP, "lr": 0.5, "round_idx": 3}).lr == 0.5
    with pytest.raises(PlatformHyperparameterError, match="n_levels"):
        platform_model_from_hyperparameters("freib", {"n_users": 6, "n_items": 7})
    with pytest.raises(PlatformHyperparameterError, match="not a cross-silo"):
        platform_model_from_hyperparameters("fedrap", HP)
    with pytest.raises(PlatformHyperparameterError, match="bad hyperparameter"):
        platform_model_from_hyperparameters("freib", {**HP, "lr": -1.0})


def test_pack_and_unpack_keep_shared_parameters_and_absent_prototypes() -> None:
    m = model()
    shared = m.init_shared(torch.Generator().manual_seed(1))
    packed = pack_global(m, shared, None)
    assert packed["proto"].shape == (3, 3) and not packed["proto_present"].any()
    s2, g = unpack_global(m, packed)
    assert g is None and all(torch.equal(s2[k], shared[k]) for k in shared)
    protos = torch.tensor([[1.0, 2.0, 3.0], [math.nan] * 3, [4.0, 5.0, 6.0]])
    packed = pack_global(m, shared, protos)
    assert packed["proto_present"].tolist() == [1.0, 0.0, 1.0] and not np.isnan(packed["proto"]).any()
    _, g = unpack_global(m, packed)
    assert g is not None and torch.isnan(g[1]).all() and torch.equal(g[0], protos[0]) and torch.equal(g[2], protos[2])
    with pytest.raises(ValueError, match="do not fit"):
        unpack_global(m, {k: v for k, v in packed.items() if k != "Eb"})


def test_server_apply_is_freibs_server_step_and_survives_dropouts() -> None:
    """Mean of 3 uploads of a planned 5: a level only one survivor had is still
    present, and its prototype is that survivor's; the shared parameters move by the mean."""
    m = model()
    shared = m.init_shared(torch.Generator().manual_seed(2))
    gen = torch.Generator().manual_seed(3)
    D, K, kb = m.shared_dim(), m.n_levels, m.k_bias
    ups = torch.zeros(3, m.update_dim)
    ups[:, :D] = torch.randn(3, D, generator=gen) * 0.1
    P = torch.randn(3, K, kb, generator=gen)
    has = torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])  # level 1: nobody; level 2: platform 0 only
    ups[:, D : D + K * kb] = (P * has.unsqueeze(2)).reshape(3, -1)
    ups[:, D + K * kb :] = has
    mean = ups.mean(0)
    out = server_apply(m, pack_global(m, shared, None), mean.numpy(), n_platforms=5)
    want_shared, want_g = server_step(m, shared, mean, 3)
    for k, v in want_shared.items():
        np.testing.assert_allclose(out[k], v.numpy(), rtol=0, atol=1e-7)
    assert out["proto_present"].tolist() == [1.0, 0.0, 1.0]
    assert want_g is not None
    np.testing.assert_allclose(out["proto"][0], P[:, 0].mean(0).numpy(), atol=1e-6)
    np.testing.assert_allclose(out["proto"][2], P[0, 2].numpy(), atol=1e-6)
    with pytest.raises(ValueError, match="shape"):
        server_apply(m, pack_global(m, shared, None), mean[:-1].numpy(), n_platforms=5)
