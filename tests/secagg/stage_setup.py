"""The one setup of the per-state secagg tests: a round driven to a given stage.

Every per-state test module (tests/secagg/test_client_*.py and
test_server_*.py) starts from these functions. Each builds a fresh
`secagg.testing.StepHarness` of `n` devices (the remaining keyword options,
`HarnessOptions`, go to StepHarness unchanged), runs the honest flow up to
the named point and returns the harness together with the messages found
there, keyed by device and typed by stage:

    function               returns the messages ...             state under test
    adverts                each device sends first              ServerAdvertiseKeys
    key_lists              the server sends to open share_keys  ClientShareKeys
    shared_keys            each device answers a KeyList with   ServerShareKeys
    share_relays           the server sends to open masked_input ClientMaskedInputCollection
    masked_inputs          each device answers a ShareRelay with ServerMaskedInputCollection
    consistency_requests   the server sends (active mode)       ClientConsistencyCheck
    consistency_signatures each device signs with (active mode) ServerConsistencyCheck
    unmasking_requests     the server sends to open unmasking   ClientUnmasking
    unmasking_responses    each device answers a request with   ServerUnmasking

`drop` = {stage: devices} silences those devices at that stage, exactly as
`StepHarness.advance_to`. A message of another type where one is expected
fails the calling test with an AssertionError, and so do the `*_state`
helpers when the state is not the one named: a broken harness cannot make a
test pass. The default sizes are those the tests were written for.

This is a plain module, imported by name (`import stage_setup`): the test
folders are not packages, and a second `conftest` would clash for mypy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypedDict, TypeVar, Unpack

from secagg.client import ClientAborted, ClientState
from secagg.config import Neighbors
from secagg.errors import AbortReason
from secagg.messages import (
    AdvertiseKeys,
    ClientAbort,
    ConsistencyRequest,
    ConsistencySignature,
    KeyList,
    MaskedInput,
    MaskingRequest,
    Message,
    ShareKeys,
    ShareReceipt,
    ShareRelay,
    UnmaskingRequest,
    UnmaskingResponse,
)
from secagg.server import ServerAborted, ServerCompleted, ServerState
from secagg.testing import StepHarness

M = TypeVar("M", bound=Message)
Drop = Mapping[str, Iterable[int]]


class HarnessOptions(TypedDict, total=False):
    """StepHarness's options besides the cohort size (see its signature)."""

    vector_length: int
    neighbors: Neighbors
    threshold: int | None
    active_adversary: bool
    removable_noise: bool


def harness(n: int, **options: Unpack[HarnessOptions]) -> StepHarness:
    """A fresh StepHarness of `n` devices, nothing sent yet."""
    return StepHarness(num_clients=n, **options)


def typed(messages: Mapping[int, Message], kind: type[M]) -> dict[int, M]:
    """`messages` as a {device: kind} dict; fails the test on any other type."""
    out: dict[int, M] = {}
    for device, message in messages.items():
        assert isinstance(message, kind), f"device {device}: expected {kind.__name__}, got {message!r}"
        out[device] = message
    return out


def first_replies(replies: Mapping[int, Sequence[Message]], kind: type[M]) -> dict[int, M]:
    """Each device's first reply (from StepHarness.deliver/start), as `kind`."""
    return typed({device: msgs[0] for device, msgs in replies.items()}, kind)


def _opening(stage: str, kind: type[M], n: int, drop: Drop | None, options: HarnessOptions) -> tuple[StepHarness, dict[int, M]]:
    h = harness(n, **options)
    outbound = h.advance_to(stage, drop=None if drop is None else dict(drop))
    return h, typed(outbound, kind)


def _answers(stage: str, kind: type[M], n: int, drop: Drop | None, options: HarnessOptions) -> tuple[StepHarness, dict[int, M]]:
    h = harness(n, **options)
    outbound = h.advance_to(stage, drop=None if drop is None else dict(drop))
    return h, first_replies(h.deliver(outbound), kind)


# Server side, stage advertise_keys: nothing to drive, the devices just start.
def adverts(n: int = 5, **options: Unpack[HarnessOptions]) -> tuple[StepHarness, dict[int, AdvertiseKeys]]:
    h = harness(n, **options)
    return h, first_replies(h.start(), AdvertiseKeys)


def key_lists(
    n: int = 5, drop: Drop | None = None, **options: Unpack[HarnessOptions]
) -> tuple[StepHarness, dict[int, KeyList]]:
    return _opening("share_keys", KeyList, n, drop, options)


def shared_keys(
    n: int = 5, drop: Drop | None = None, **options: Unpack[HarnessOptions]
) -> tuple[StepHarness, dict[int, ShareKeys]]:
    return _answers("share_keys", ShareKeys, n, drop, options)


def share_relays(
    n: int = 5, drop: Drop | None = None, **options: Unpack[HarnessOptions]
) -> tuple[StepHarness, dict[int, ShareRelay]]:
    return _opening("share_check", ShareRelay, n, drop, options)


def share_receipts(
    n: int = 5, drop: Drop | None = None, **options: Unpack[HarnessOptions]
) -> tuple[StepHarness, dict[int, ShareReceipt]]:
    return _answers("share_check", ShareReceipt, n, drop, options)


def masking_requests(
    n: int = 5, drop: Drop | None = None, **options: Unpack[HarnessOptions]
) -> tuple[StepHarness, dict[int, MaskingRequest]]:
    return _opening("masked_input", MaskingRequest, n, drop, options)


def masked_inputs(
    n: int = 6, drop: Drop | None = None, **options: Unpack[HarnessOptions]
) -> tuple[StepHarness, dict[int, MaskedInput]]:
    return _answers("masked_input", MaskedInput, n, drop, options)


# The consistency check exists only in active mode, so these two turn it on.
def consistency_requests(
    n: int = 6, drop: Drop | None = None, **options: Unpack[HarnessOptions]
) -> tuple[StepHarness, dict[int, ConsistencyRequest]]:
    return _opening("consistency_check", ConsistencyRequest, n, drop, {**options, "active_adversary": True})


def consistency_signatures(
    n: int = 6, drop: Drop | None = None, **options: Unpack[HarnessOptions]
) -> tuple[StepHarness, dict[int, ConsistencySignature]]:
    return _answers("consistency_check", ConsistencySignature, n, drop, {**options, "active_adversary": True})


def unmasking_requests(
    n: int = 6, drop: Drop | None = None, **options: Unpack[HarnessOptions]
) -> tuple[StepHarness, dict[int, UnmaskingRequest]]:
    return _opening("unmasking", UnmaskingRequest, n, drop, options)


def unmasking_responses(
    n: int = 6, drop: Drop | None = None, **options: Unpack[HarnessOptions]
) -> tuple[StepHarness, dict[int, UnmaskingResponse]]:
    return _answers("unmasking", UnmaskingResponse, n, drop, options)


def close_typed(h: StepHarness, kind: type[M]) -> dict[int, M]:
    """Close the server's stage (StepHarness.close); its messages as `kind`."""
    return typed(h.close(), kind)


def close_with_only(h: StepHarness, messages: Mapping[int, Message], senders: Iterable[int]) -> list[Message]:
    """Hand the server only the `senders`' messages, then close its stage:
    the messages the server sends on closing (the others stay silent)."""
    for device in senders:
        h.server, _ = h.server.handle(device, messages[device])
    h.server, out = h.server.close()
    return out


def completed(state: ServerState[Any]) -> ServerCompleted:
    """`state`, which must be ServerCompleted (fails the test otherwise)."""
    assert isinstance(state, ServerCompleted), state
    return state


def server_aborted(state: ServerState[Any], reason: AbortReason) -> ServerAborted:
    """`state`, which must be ServerAborted for `reason` (fails the test otherwise)."""
    assert isinstance(state, ServerAborted), state
    assert state.reason is reason, state
    return state


def assert_client_aborted(state: ClientState[Any], out: Sequence[Message], reason: AbortReason) -> None:
    """The device aborted for `reason` and its only message is the abort notice
    for that reason (so it revealed nothing)."""
    assert isinstance(state, ClientAborted), state
    assert state.reason is reason, state
    assert len(out) == 1, out
    assert isinstance(out[0], ClientAbort) and out[0].reason is reason, out


def ill_typed(value: object) -> Any:
    """`value` as Any: for the tests that hand a state a wrong type on purpose
    (the states check their inputs at run time; mypy would refuse the call)."""
    return value
