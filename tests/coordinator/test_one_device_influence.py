"""How far one hostile device moves the committed global model (D34, D35, D86).

A device that follows the protocol in every other respect masks its input
correctly but puts an arbitrary element of Z_{2^32} where its fixed-point
encoding (an integer in [0, max_level]) belongs. Its masks cancel as usual,
so the coordinator unmasks (honest sum + that element) mod 2^32 and cannot
tell it from an honest sum: nothing in secure aggregation checks an input's
range. This test MEASURES that limit; it does not close it (D86 says what
would). The coordinator reduces the unmasked sum mod 2^w before decoding
(`rounds.aggregate_result`, `FixedPointEncoding.reduce`), so whatever the
modulus the attacker's reach is the same, relative to the clip.

Each case runs a real in-process secure round (`secagg.inprocess.run_round`:
every device's own keys, masks and shares, every message through its wire
encoding), then the coordinator's own steps on the unmasked sum: the secagg
configuration its policy picks (`round_policy.secagg_config_for`, default
settings), the decoding (`rounds.aggregate_result`) and FedRAP's server step
(`model_host`, as `CurrentModel.stepped` runs it). The attacker is the worst
case: it knows the honest devices' sum and picks its element per coordinate
to put the unmasked sum at 2^32 - 1 (even coordinates) or 0 (odd ones).

What holds, and is asserted:
- the round completes and the decode never fails: the committed mean is
  finite, and equals the closed form below exactly;
- with the default 32-bit modulus, one device sets each coordinate of the
  mean anywhere in [-c, c (2^32 - 1) / (m max_level) - c] ~ [-c, c (2n/m - 1)]
  (n cohort, m counted, c the clip): the whole clip box when no one drops,
  up to (2n/t - 1) c beyond it when m falls to the threshold t; an honest
  device moves a coordinate of the mean by at most 2c/m;
- with `secagg.modulus_bits` w < 32 the same reach, relative to the clip:
  the coordinator reduces the unmasked sum mod 2^w, so the attacker's
  2^32 - 1 decodes as 2^w - 1. (Until this was fixed the coordinator decoded
  the uint32 sum as it was, and the reach was 2^(32 - w) times larger: at
  w = 16, 196,619 on the mean instead of 2.04; D86.)
The figures are printed (`pytest -s`) and recorded in D35.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from coordinator.model_host import build_server_model
from coordinator.round_policy import secagg_config_for
from coordinator.aggregate import aggregate_result
from coordinator.settings import CoordinatorSettings
from secagg.config import SecAggConfig
from secagg.inprocess import SERVER, DropoutPlan, run_round
from secagg.messages import MaskedInput, Message
from wire.round_metrics import MetricLayout

N = 6  # cohort
HOSTILE = 0
N_ITEMS = 20  # FedRAP: the update is the item table C, N_ITEMS x 32
TOP = np.uint32(0xFFFFFFFF)


def _targets(length: int) -> np.ndarray:
    """The unmasked sum the attacker aims at: 2^32 - 1 on even coordinates, 0 on odd ones."""
    t = np.zeros(length, dtype=np.uint32)
    t[0::2] = TOP
    return t


def _round(config: SecAggConfig, inputs: np.ndarray, dropouts: DropoutPlan, hostile: np.ndarray | None,
           ) -> tuple[np.ndarray, tuple[int, ...]]:
    """One secure round; `hostile` (uint32) is added to device HOSTILE's masked
    input on its way to the server. Returns the unmasked sum and who counted."""

    def intercept(sender: int, receiver: int, msg: Message) -> Message:
        if hostile is not None and sender == HOSTILE and receiver == SERVER and isinstance(msg, MaskedInput):
            return dataclasses.replace(msg, vector=msg.vector + hostile)  # uint32: wraps mod 2^32
        return msg

    out = run_round(inputs, config=config, dropouts=dropouts, seed=7, stochastic_rounding=False,
                    intercept=intercept)
    assert out.ok, (out.abort_reason, out.abort_detail)
    assert out.encoded_sum is not None
    assert HOSTILE in out.counted
    return out.encoded_sum, out.counted


@pytest.mark.parametrize(("modulus_bits", "dropped"), [(32, 0), (32, 2), (16, 2)],
                         ids=["w32-none-dropped", "w32-two-dropped", "w16-two-dropped"])
def test_one_hostile_device_moves_the_committed_model_as_far_as_the_decoding_reaches(
        modulus_bits: int, dropped: int) -> None:
    model = build_server_model("fedrap", {"n_users": N, "n_items": N_ITEMS})
    length = model.update_dim
    settings = CoordinatorSettings()
    settings = settings.model_copy(update={"secagg": settings.secagg.model_copy(update={"modulus_bits": modulus_bits})})
    config = secagg_config_for(settings, N, length, b"one-device-influence")
    enc, clip = config.encoding, config.encoding.clip
    no_metrics = MetricLayout.for_round((), enc)
    rng = np.random.default_rng(3)
    inputs = rng.uniform(-0.05, 0.05, size=(N, length))  # honest updates, well inside the clip
    plan = DropoutPlan(masked_input=frozenset(range(N - dropped, N)))
    params = model.init_parameters(0)

    # The honest round: every device, the attacker included, sends its own encoding.
    honest_sum, counted = _round(config, inputs, plan, None)
    m = len(counted)
    assert m == N - dropped >= config.threshold
    honest = aggregate_result(config, no_metrics, honest_sum, counted)
    np.testing.assert_allclose(honest.decoded_mean, inputs[list(counted)].mean(axis=0), atol=enc.step)

    # The attack: the device's own input at -c (encoded 0), plus the element that
    # puts the unmasked sum on the targets, given the others' (known) sum.
    others = sum(enc.encode(inputs[i]).astype(np.uint64) for i in counted if i != HOSTILE)
    element = (_targets(length).astype(np.uint64) - others) % (1 << 32)
    attacked = inputs.copy()
    attacked[HOSTILE] = -clip
    hostile_sum, counted_h = _round(config, attacked, plan, element.astype(np.uint32))
    assert counted_h == counted  # the coordinator counts it like any other device
    np.testing.assert_array_equal(hostile_sum, _targets(length))  # what secagg unmasks, mod 2^32
    hostile = aggregate_result(config, no_metrics, hostile_sum, counted)  # the decode does not refuse it
    top = (1 << modulus_bits) - 1  # 2^32 - 1 reduced mod 2^w
    np.testing.assert_array_equal(hostile.encoded_sum, _targets(length) & np.uint32(top))
    mean = hostile.decoded_mean
    assert np.isfinite(mean).all()
    reach_hi = top / enc.scale / m - clip  # the closed form of the top of the reach
    np.testing.assert_allclose(mean[0::2], reach_hi, rtol=1e-12)
    np.testing.assert_allclose(mean[1::2], -clip, rtol=1e-12)

    # The committed model: FedRAP's server step on each mean.
    new_honest = model.apply_mean(params, honest.decoded_mean, 0)
    new_hostile = model.apply_mean(params, mean, 0)
    assert all(np.isfinite(v).all() for v in new_hostile.values())
    delta_model = max(float(np.abs(new_hostile[k] - new_honest[k]).max()) for k in new_honest)
    delta_mean = float(np.abs(mean - honest.decoded_mean).max())
    honest_reach = 2 * clip / m  # the most an honest device moves one coordinate of the mean
    step_gain = delta_model / delta_mean  # FedRAP's server step is linear in the mean
    print(f"\n[one-device influence] w={modulus_bits} n={N} m={m} clip={clip}: mean reach "
          f"[{-clip:.3g}, {reach_hi:.6g}] (2n/m - 1 = {2 * N / m - 1:.3g}); max |delta mean| {delta_mean:.6g} "
          f"= {delta_mean / honest_reach:.4g} x an honest device's {honest_reach:.3g}; "
          f"max |delta C| of the committed model {delta_model:.6g} (server step x{step_gain:.3g})")

    # The same reach, relative to the clip, for every modulus: (2^w - 1) / max_level
    # is n plus at most n / max_level (max_level = floor((2^w - 1) / n)).
    assert reach_hi == pytest.approx(clip * (2 * N / m - 1), rel=1e-3 if modulus_bits < 32 else 1e-8)
    assert delta_mean <= clip * (2 * N / m - 1) * (1 + 1e-3) + 0.05 + enc.step
    assert delta_mean >= clip  # at least the whole clip range's half: far past an honest device
    assert delta_mean > (N / 2 - 0.5) * honest_reach
