"""A device's own choice of path in a FedMMF hybrid round (edge_client/path_choice.py)."""

from __future__ import annotations

import math

import pytest

from edge_client.path_choice import coordinator_bound, plaintext_rows
from wire.protocol import HYBRID_J_BOUND_HYPERPARAMETER as KEY


def test_plaintext_only_below_both_the_rounds_bound_and_the_clients_own_cap():
    J = [0.2, 0.4, 0.6, math.nan]
    assert plaintext_rows(J, 4, coordinator=0.5, own=1.0) == [True, True, False, False]
    assert plaintext_rows(J, 4, coordinator=1e9, own=0.3) == [True, False, False, False]  # the client's cap wins
    assert plaintext_rows(J, 4, coordinator=0.5, own=None) == [False] * 4  # no consent: never plaintext
    assert plaintext_rows(None, 4, coordinator=0.5, own=1.0) == [False] * 4  # a model without J
    assert plaintext_rows(J, 4, coordinator=None, own=1.0) == [False] * 4
    with pytest.raises(ValueError):
        plaintext_rows(J, 3, coordinator=0.5, own=1.0)


@pytest.mark.parametrize("value, want", [(0.5, 0.5), (1, 1.0), (-1, None), (True, None), ("0.5", None),
                                         (float("inf"), None), (None, None)])
def test_the_tasks_bound_is_read_strictly(value, want):
    assert coordinator_bound({KEY: value} if value is not None else {}) == want
