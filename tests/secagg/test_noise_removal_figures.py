"""The figures `fedmask bench round --dp-dropouts` reports
(fedmask.bench.noise_removal): the message sizes against real messages of a
round, the removal log lines the coordinator writes, and the two epsilons."""

from __future__ import annotations

from fractions import Fraction

import pytest

from coordinator.logs import format_event
from dpmech import accounting
from dpmech.mechanism import MechanismConfig, privacy_rho
from fedmask.bench.noise_removal import epsilons, message_bytes, removal_seconds
from secagg.messages import ShareKeys, UnmaskingResponse
from stage_setup import shared_keys, unmasking_responses
from wire import RoundIds, secagg_codec


def test_the_message_sizes_are_those_of_a_real_round() -> None:
    """6 devices with ids 1..6 and a 48-byte session id, t = 4 (m = 2); one
    drops at masked input: the sizes match the protos the codec makes of the
    harness's real ShareKeys and UnmaskingResponse."""
    opts = {"threshold": 4, "removable_noise": True, "session_id": bytes(48)}
    ids = RoundIds.from_cohort(range(1, 7), components=2)
    _, shares = shared_keys(6, **opts)  # type: ignore[arg-type]
    real_share_keys = secagg_codec.client_to_proto(shares[5], ids)
    _, responses = unmasking_responses(6, {"masked_input": [5]}, **opts)  # type: ignore[arg-type]
    real_response = secagg_codec.client_to_proto(responses[4], ids)
    assert isinstance(shares[5], ShareKeys) and isinstance(responses[4], UnmaskingResponse)
    assert len(responses[4].component_shares) == 5  # 5 counted, component 2 each
    real_share_keys.round_number = real_response.round_number = 1  # the harness's round 0 is not on the wire
    sizes = message_bytes(6, 2, 5, 1)
    assert sizes.share_keys == real_share_keys.ByteSize()
    assert sizes.unmasking_response == real_response.ByteSize()
    plain = message_bytes(6, 0, 5, 0)
    assert plain.share_keys < sizes.share_keys and plain.unmasking_response < sizes.unmasking_response


def test_removal_lines_are_read_from_the_coordinators_log() -> None:
    log = "\n".join(["INFO x " + format_event("surplus_removed", {"round": 3, "components": 48, "seconds": 1.25}),
                     "INFO x " + format_event("round_started", {"round": 4}),
                     "INFO x " + format_event("surplus_removed", {"round": 5, "components": 0, "seconds": 0.0})])
    assert removal_seconds(log) == {3: (1.25, 48), 5: (0.0, 0)}


def test_the_proven_epsilon_is_the_ledgers_and_the_unequal_shares_one_is_the_targets() -> None:
    mech = MechanismConfig(dim=60, clip=1.0, scale=1024.0, sigma2=Fraction(40_000), bits=32, devices=10)
    d19 = epsilons(mech, 10, 7, 8, 1e-5, removable=False)
    assert set(d19) == {"proven"} and d19["proven"] == pytest.approx(accounting.epsilon([privacy_rho(mech, 8)], 1e-5))
    dordis = epsilons(mech, 10, 7, 8, 1e-5, removable=True)
    assert dordis["proven"] == d19["proven"]
    full = accounting.epsilon([privacy_rho(mech, 10)], 1e-5)  # no dropout: what the kept noise targets
    assert dordis["unequal_shares"] < d19["proven"]
    assert dordis["unequal_shares"] == pytest.approx(full, rel=1e-3)
