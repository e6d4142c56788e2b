"""Removable noise in secure aggregation (Dordis's way): each device shares
m = n - t component seeds beside b_v and s_v^SK; at unmasking only the
counted devices' components k > n - |U3| are revealed and rebuilt. The
property test (test_round_properties.py) checks every dropout pattern
against an oracle; these tests check the refusals, one rule each."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest

from secagg import shamir
from secagg.client import ClientAdvertiseKeys, ClientAborted
from secagg.config import SecAggConfig
from secagg.errors import AbortReason, DropReason, ProtocolMisuse, SecAggConfigError
from secagg.messages import UnmaskingRequest, UnmaskingResponse
from secagg.server.share_keys import SEALED_SHARES_BYTES, sealed_shares_bytes
from stage_setup import completed, server_aborted, shared_keys, unmasking_requests, unmasking_responses


def _config(n: int = 6, t: int = 4, **kw: object) -> SecAggConfig:
    return SecAggConfig.create(num_clients=n, vector_length=3, session_id=b"s", threshold=t, **kw)  # type: ignore[arg-type]


def test_the_config_counts_the_components_and_which_a_sum_of_s_loses() -> None:
    cfg = _config(10, 7, removable_noise=True)
    assert cfg.removable_components == 3
    assert list(cfg.removed_components(10)) == [1, 2, 3]  # nobody dropped: all surplus goes
    assert list(cfg.removed_components(8)) == [3]  # two dropped: components 0..2 stay
    assert list(cfg.removed_components(7)) == []  # t counted: every share is needed
    assert _config(10, 7).removable_components == 0 and list(_config(10, 7).removed_components(9)) == []


def test_removable_noise_needs_the_complete_graph() -> None:
    with pytest.raises(SecAggConfigError, match="complete graph"):
        SecAggConfig.create(num_clients=12, vector_length=3, session_id=b"s", neighbors=4, removable_noise=True)


@pytest.mark.parametrize("seeds", [(), (b"x" * 32,), (b"x" * 31, b"y" * 32)], ids=["none", "too-few", "short"])
def test_a_device_needs_exactly_m_seeds_of_32_bytes(seeds: tuple[bytes, ...]) -> None:
    cfg = _config(6, 4, removable_noise=True)  # m = 2
    with pytest.raises(ProtocolMisuse, match="removable seeds"):
        ClientAdvertiseKeys(cfg, 0, 0, np.zeros(3, dtype=np.uint32), removable_seeds=seeds)
    with pytest.raises(ProtocolMisuse, match="removable seeds"):  # and none without removable noise
        ClientAdvertiseKeys(_config(6, 4), 0, 0, np.zeros(3, dtype=np.uint32), removable_seeds=(b"x" * 32,))


def test_each_sealed_blob_carries_one_share_per_component() -> None:
    h, shares = shared_keys(6, threshold=4, removable_noise=True)
    sizes = {len(blob) for m in shares.values() for _, blob in m.shares}
    assert sizes == {sealed_shares_bytes(2)} and sealed_shares_bytes(2) == SEALED_SHARES_BYTES + 2 * shamir.ELEMENT_BYTES


def test_a_blob_of_the_plain_size_is_dropped_in_a_removable_round() -> None:
    """A device that does not share its component seeds (an older client)
    costs only its own participation."""
    h, shares = shared_keys(6, threshold=4, removable_noise=True)
    bad = shares[1]
    short = dataclasses.replace(bad, shares=tuple((u, blob[:SEALED_SHARES_BYTES]) for u, blob in bad.shares))
    for i, m in shares.items():
        h.server, _ = h.server.handle(i, short if i == 1 else m)
    assert h.server.record.dropped[1][1] is DropReason.MALFORMED_MESSAGE


def test_unmasking_reveals_only_the_components_above_the_dropouts() -> None:
    # n = 6, t = 4, m = 2; one device drops at masked input: s = 5, j = 1, only component 2 goes
    h, requests = unmasking_requests(6, {"masked_input": [3]}, threshold=4, removable_noise=True)
    h2, responses = unmasking_responses(6, {"masked_input": [3]}, threshold=4, removable_noise=True)
    for m in responses.values():
        assert {k for _, k, _ in m.component_shares} == {2}
        assert {u for u, _, _ in m.component_shares} == {u for u, _ in m.b_shares}
    for i, m in responses.items():
        h2.server, _ = h2.server.handle(i, m)
    h2.server, _ = h2.server.close()
    done = completed(h2.server)
    assert done.counted == (0, 1, 2, 4, 5)
    assert {u: dict(ks) for u, ks in done.removed_seeds.items()} == {
        u: {2: h2.component_seeds[u][1]} for u in done.counted}
    np.testing.assert_array_equal(done.encoded_sum, h2.encoded[list(done.counted)].sum(0, dtype=np.uint32))


def test_a_device_told_fewer_alive_reveals_fewer_components() -> None:
    """The device derives j from the alive list it is sent: a server naming
    fewer survivors gets fewer seeds, never more (here t alive: none)."""
    h, requests = unmasking_requests(6, {"masked_input": [3]}, threshold=4, removable_noise=True)
    req = requests[0]
    fewer = dataclasses.replace(req, alive=tuple(u for u in req.alive if u not in (4,)))
    h.clients[0], out = h.clients[0].handle(fewer)
    (resp,) = out
    assert isinstance(resp, UnmaskingResponse) and resp.component_shares == ()


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda m: dataclasses.replace(m, component_shares=m.component_shares + m.component_shares[:1]),
                     id="repeated"),
        pytest.param(lambda m: dataclasses.replace(
            m, component_shares=tuple((u, 1, x) for u, _, x in m.component_shares)), id="a-kept-component"),
        pytest.param(lambda m: dataclasses.replace(m, component_shares=((3, 2, 1),)), id="a-dropped-owner"),
        pytest.param(lambda m: dataclasses.replace(m, component_shares=((0, 3, 1),)), id="beyond-m"),
        pytest.param(lambda m: dataclasses.replace(m, component_shares=((0, 2, shamir.PRIME),)), id="not-in-field"),
        pytest.param(lambda m: dataclasses.replace(m, component_shares=((0, 2),)), id="malformed"),
    ],
)
def test_a_bad_component_share_drops_the_response_whole(
    mutate: Callable[[UnmaskingResponse], UnmaskingResponse],
) -> None:
    h, resp = unmasking_responses(6, {"masked_input": [3]}, threshold=4, removable_noise=True)
    for i, m in resp.items():
        h.server, _ = h.server.handle(i, mutate(m) if i == 1 else m)
    assert h.server.record.dropped[1][1] is DropReason.MALFORMED_MESSAGE
    h.server, _ = h.server.close()  # the four others still hold t shares of everything
    done = completed(h.server)
    assert set(done.removed_seeds) == set(done.counted)


def test_a_corrupted_component_share_rebuilds_a_wrong_seed_and_the_masked_sum_stays_exact() -> None:
    """Seeds carry no public check (unlike s_u^SK, checked against its
    public key): a wrong share rebuilds a wrong seed, as a wrong b-share
    rebuilds a wrong self-mask seed (Bonawitz's known limit, D37: wrong
    shares at unmasking corrupt the result). The masked inputs' sum is
    untouched; only the removal would be wrong."""
    h, resp = unmasking_responses(6, {"masked_input": [3]}, threshold=4, removable_noise=True)
    m = resp[0]  # x = 1, the smallest evaluation point: in every rebuild
    bad = dataclasses.replace(m, component_shares=tuple((u, k, (x + 1) % shamir.PRIME)
                                                       for u, k, x in m.component_shares))
    for i, r in resp.items():
        h.server, _ = h.server.handle(i, bad if i == 0 else r)
    h.server, _ = h.server.close()
    done = completed(h.server)
    assert all(done.removed_seeds[u][2] != h.component_seeds[u][1] for u in done.counted)
    np.testing.assert_array_equal(done.encoded_sum, h.encoded[list(done.counted)].sum(0, dtype=np.uint32))


def test_wire_bytes_round_trip_with_component_shares() -> None:
    from secagg.messages import decode_message
    m = UnmaskingResponse(session_id=b"s", round_idx=3, device_id=1, b_shares=((0, 5),), s_shares=(),
                          component_shares=((0, 2, 7), (4, 2, shamir.PRIME - 1)))
    assert decode_message(m.to_bytes()) == m


def test_too_few_component_shares_abort_the_round() -> None:
    h, resp = unmasking_responses(6, {"masked_input": [3]}, threshold=4, removable_noise=True)
    for i, m in resp.items():  # only 0 and 1 give their component shares: 2 < t
        h.server, _ = h.server.handle(i, m if i in (0, 1) else dataclasses.replace(m, component_shares=()))
    h.server, _ = h.server.close()
    server_aborted(h.server, AbortReason.TOO_FEW_UNMASKING_RESPONSES)


def test_the_client_refuses_an_unmasking_request_before_revealing_anything() -> None:
    """The request checks of ClientUnmasking run before any component share
    is chosen: a request listing the device dropped reveals nothing."""
    h, requests = unmasking_requests(6, {"masked_input": [3]}, threshold=4, removable_noise=True)
    req: UnmaskingRequest = requests[0]
    h.clients[0], out = h.clients[0].handle(dataclasses.replace(req, dropped=req.dropped + (0,)))
    assert isinstance(h.clients[0], ClientAborted) and all(not isinstance(m, UnmaskingResponse) for m in out)
