"""The RoundTask's secagg settings and a round in groups (D87): a group's
config is not what SecaggSettings can describe."""

from __future__ import annotations

import pytest

from secagg.config import SecAggConfig
from wire.errors import WireError
from wire.round_task import secagg_config_from_proto, secagg_settings_to_proto


def test_a_group_config_is_not_sent_over_the_wire_it_cannot_describe() -> None:
    """SecaggSettings carry one size; a group's encoding (sized for a larger
    cohort) would be rebuilt at another scale by the device, so the
    coordinator side refuses to write it."""
    whole = SecAggConfig.create(num_clients=10, vector_length=3, session_id=b"s")
    assert secagg_config_from_proto(secagg_settings_to_proto(whole), b"s") == whole
    group = SecAggConfig.create(num_clients=10, vector_length=3, session_id=b"s", encoding_clients=40)
    with pytest.raises(WireError, match="one cohort size"):
        secagg_settings_to_proto(group)
