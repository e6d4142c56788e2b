"""The discrete Gaussian (D88) wired into the coordinator: the round's task,
its vector, its decoding, its ledger entry and the configurations refused.

Oracles: `dpmech` itself (the mechanism a device rebuilds from the task must
be the coordinator's, its rho priced with the counted devices' shares), the
devices' own clipped updates (the committed mean must be their mean within
the noise the sum carries), and the devices' residues (the committed sum is
their sum mod 2^w, bit for bit)."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from coordinator.debug import encoded_checksum
from coordinator.round_policy import dp_refusal, dp_settings_for, masked_length, metric_names_for, round_plan
from coordinator.server import check_dp
from coordinator.settings import CoordinatorSettings, DpSettings, SettingsError
from coordinator.store import InMemoryStore, RoundState
from coordinator.store.blobs import unpack_parameters
from dpmech import accounting
from dpmech.calibrate import noise_multiplier_of
from dpmech.mechanism import privacy_rho
from fedmask_proto.v1 import session_pb2
from wire import parse_round_task

from test_grpc_end_to_end import SHORT, _clients, _wait_rounds, make_settings, running


def _settings(**over: object) -> CoordinatorSettings:
    return CoordinatorSettings.load(overrides={"dp.mode": "distributed", "cohort.size": 20, "cohort.minimum": 5,
                                               **over})


def test_discrete_gaussian_is_the_default_and_its_round_carries_residues_without_metrics() -> None:
    s = _settings()
    assert s.dp.mechanism == "discrete-gaussian" and DpSettings().mechanism == "discrete-gaussian"
    config, metrics, mech = round_plan(s, 20, 1000, b"sid", ("devices", "examples"), plaintext=False)
    assert mech is not None and (mech.dim, mech.padded_dim, mech.devices, mech.bits) == (1000, 1024, 20, 32)
    assert config.vector_length == 1024 and metrics.coordinates == 0  # the totals would be outside epsilon
    assert metric_names_for(("devices",), s.dp, plaintext=False) == ()
    assert masked_length(s, 1000) == 1024
    task_dp = dp_settings_for(s.dp, 20, mech)
    assert task_dp.mechanism == session_pb2.DP_MECHANISM_DISCRETE_GAUSSIAN and task_dp.noise_stddev == 0
    assert (task_dp.noise_variance_numerator, task_dp.noise_variance_denominator) == (mech.sigma2.numerator,
                                                                                      mech.sigma2.denominator)
    # distributed: the 20 devices' shares together carry the noise multiplier of the settings
    assert noise_multiplier_of(privacy_rho(mech, 20)) == pytest.approx(s.dp.noise_multiplier, rel=1e-3)
    assert noise_multiplier_of(privacy_rho(mech, 20)) >= s.dp.noise_multiplier * (1 - 1e-9)
    local = _settings(**{"dp.mode": "local"})
    _, _, own = round_plan(local, 20, 1000, b"sid", (), plaintext=False)
    assert own is not None and noise_multiplier_of(privacy_rho(own, 1)) >= local.dp.noise_multiplier * (1 - 1e-9)
    with pytest.raises(ValueError, match="needs its mechanism"):
        dp_settings_for(s.dp, 20)


def test_invalid_discrete_gaussian_configurations_are_refused_with_a_clear_message() -> None:
    small = _settings(**{"secagg.modulus_bits": 8})
    why = dp_refusal(small, 53_824)
    assert why is not None and "too small" in why and "need w >= 12" in why
    with pytest.raises(ValueError, match="too small"):
        check_dp(small, 53_824)
    assert dp_refusal(_settings(**{"secagg.modulus_bits": 16}), 53_824) is None
    with pytest.raises(SettingsError, match="zCDP"):
        _settings(**{"dp.accountant": "pld"})
    with pytest.raises(SettingsError, match="noise_multiplier > 0"):
        _settings(**{"dp.noise_multiplier": 0.0})
    _settings(**{"dp.accountant": "pld", "dp.mechanism": "gaussian-float"})  # the float path keeps its accountants


def test_the_ledger_composes_a_discrete_gaussian_round_as_its_zcdp_event() -> None:
    """Storing z = 1 / sqrt(2 rho) composes, under the RDP accountant, as
    dp_accounting's ZCDpEvent(rho): one round and several."""
    from models.privacy import composed_epsilon

    _, _, mech = round_plan(_settings(), 20, 1000, b"s", (), plaintext=False)
    assert mech is not None
    for counted in (20, 14):
        rho = privacy_rho(mech, counted)
        z = noise_multiplier_of(rho)
        assert composed_epsilon([(z, 1.0)], delta=1e-5) == pytest.approx(accounting.epsilon([rho], 1e-5), rel=1e-9)
        assert composed_epsilon([(z, 1.0)] * 3, delta=1e-5) == pytest.approx(
            accounting.epsilon([rho] * 3, 1e-5), rel=1e-9)


def test_a_discrete_gaussian_round_over_grpc_decodes_the_counted_devices_and_prices_their_shares() -> None:
    """5 devices, distributed discrete Gaussian, one silent at its masked
    input: the task names the mechanism (the device rebuilds the same one),
    the committed sum is the 4 counted devices' residues summed, the model
    steps by their clipped mean plus the noise of 4 shares, and the ledger
    prices 4 shares, not 5 (D19)."""
    async def main() -> None:
        settings = make_settings(**{"cohort.size": 5, "dp.mode": "distributed", "dp.noise_multiplier": 1.0,
                                    "dp.clip": 0.5, "model.hyperparameters": {"vector_length": 10}, **SHORT})
        store = InMemoryStore()
        async with running(settings, store) as (coord, target, _, rounds):
            clients, devices = await _clients(target, 5, groups=2, silent={1: "masked_input"})
            await _wait_rounds(rounds)
            rec = store.get_round(1)
            assert rec is not None and rec.state is RoundState.COMMITTED
            assert not [k for k in rec.metrics if k.startswith(("count.", "sum.", "val_"))]  # no metric totals
            task = next(t for c in clients for t in c.tasks)
            view = parse_round_task(task)
            mech = view.mechanism
            assert mech is not None and view.update_length == 10 and task.secagg.vector_length == 16
            counted = [d for d in devices if d.device_id in rec.survivors["masked_input"]]
            assert len(counted) == 4
            words = np.asarray(np.sum([d.encoded for d in counted], axis=0, dtype=np.uint64), dtype=np.uint32)
            assert rec.metrics["debug.encoded_checksum"] == encoded_checksum(words)
            version = store.latest_model_version("synthetic")
            assert version is not None
            mean = unpack_parameters(version.parameters)["mean"]
            clipped = [d.update * min(1.0, 0.5 / float(np.linalg.norm(d.update))) for d in counted]
            noise_std = math.sqrt(4 * float(mech.sigma2)) / mech.scale / 4  # of the mean, per coordinate
            error = mean - np.mean(clipped, axis=0)
            assert np.abs(error).max() < 6 * noise_std and error.std() > noise_std / 5  # noise, and only noise
            (entry,) = store.privacy_ledger()
            assert entry.noise_multiplier == pytest.approx(noise_multiplier_of(privacy_rho(mech, 4)))
            assert entry.noise_multiplier == pytest.approx(math.sqrt(4 / 5), rel=1e-3)
            assert entry.epsilon == pytest.approx(accounting.epsilon([privacy_rho(mech, 4)], settings.dp.delta))
            for c in clients:
                await c.close()

    asyncio.run(main())


def test_removable_noise_over_grpc_removes_the_counted_devices_surplus_and_prices_the_proven_bound() -> None:
    """Dordis's way (D110): 6 devices, threshold 4, one silent at its masked
    input. Each device adds components 0..2 and shares the seeds of 1 and 2;
    the 5 counted devices keep components 0 and 1, so the committed sum is
    their residues minus every counted device's component 2, bit for bit
    (the oracle regenerates it from the seeds the fake devices drew). The
    ledger prices the proven bound: the best single component's shares,
    component 0 of the 5 counted (D19's figure for the same round)."""
    from dpmech.removable_noise import best_group_rho, component_noise

    async def main() -> None:
        settings = make_settings(**{"cohort.size": 6, "dp.mode": "distributed", "dp.noise_multiplier": 1.0,
                                    "dp.clip": 0.5, "dp.dropouts": "remove", "secagg.graph": "full",
                                    "secagg.threshold": "majority", "model.hyperparameters": {"vector_length": 10},
                                    **SHORT})
        store = InMemoryStore()
        async with running(settings, store) as (coord, target, _, rounds):
            clients, devices = await _clients(target, 6, groups=2, silent={2: "masked_input"})
            await _wait_rounds(rounds)
            rec = store.get_round(1)
            assert rec is not None and rec.state is RoundState.COMMITTED, rec
            view = parse_round_task(next(t for c in clients for t in c.tasks))
            mech, removable = view.mechanism, view.removable
            assert mech is not None and removable is not None and view.config.threshold == 4
            assert removable.components == 2 and len(removable.removed(5)) == 1
            counted = [d for d in devices if d.device_id in rec.survivors["masked_input"]]
            assert len(counted) == 5 and all(len(d.component_seeds) == 2 for d in counted)
            total = np.sum([d.encoded for d in counted], axis=0, dtype=np.uint64).astype(np.int64)
            for d in counted:
                total -= component_noise(d.component_seeds[1], removable.variances[2], mech.padded_dim)
            words = np.asarray(total % (1 << mech.bits), dtype=np.uint32)
            assert rec.metrics["debug.encoded_checksum"] == encoded_checksum(words)
            (entry,) = store.privacy_ledger()
            l2, l1 = accounting.sensitivities(mech.bound_sq, mech.padded_dim)
            proven = best_group_rho(l2=l2, l1=l1, variances=removable.variances, devices=6, threshold=4,
                                    survivors=5, padded_dim=mech.padded_dim)
            assert proven == pytest.approx(privacy_rho(mech, 5), rel=1e-12)
            assert entry.noise_multiplier == pytest.approx(noise_multiplier_of(proven))
            for c in clients:
                await c.close()

    asyncio.run(main())


def test_removable_noise_is_refused_where_it_cannot_run() -> None:
    with pytest.raises(SettingsError, match="distributed"):
        _settings(**{"dp.dropouts": "remove", "dp.mode": "local", "secagg.graph": "full"})
    with pytest.raises(SettingsError, match="distributed"):
        _settings(**{"dp.dropouts": "remove", "dp.mechanism": "gaussian-float", "secagg.graph": "full"})
    with pytest.raises(SettingsError, match="secagg.graph 'full'"):
        _settings(**{"dp.dropouts": "remove"})
    with pytest.raises(SettingsError, match="dp.dropouts 'remove'"):
        _settings(**{"dp.dropouts": "remove", "secagg.graph": "full", "cohort.size": 1000, "cohort.minimum": 500,
                     "secagg.group_size": 100})
    _settings(**{"dp.dropouts": "remove", "secagg.graph": "full"})
