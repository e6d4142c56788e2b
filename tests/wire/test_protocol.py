"""The shared protocol vocabulary: one Stage, the version rule, loopback."""

from __future__ import annotations

import pytest

from coordinator.store import RoundState
from edge_client.faults import DROP_STAGES
from secagg import client as secagg_client
from secagg import server as secagg_server
from secagg.stages import CLI_NAMES, Stage
from wire.protocol import (
    PROTOCOL_VERSION,
    SERVER_FIELD_STAGE,
    coordinator_refusal,
    is_loopback,
    is_loopback_target,
    parse_version,
    version_refusal,
)


def test_one_set_of_stage_names_everywhere() -> None:
    for s in Stage:
        assert RoundState(s.value).stage is s
        assert RoundState(s.value).value == s.value
        assert Stage.parse(s.cli_name) is s and Stage.parse(s.value) is s
    assert tuple(DROP_STAGES) == CLI_NAMES
    assert set(SERVER_FIELD_STAGE.values()) == set(Stage) - {Stage.ADVERTISE_KEYS}
    for module, base in ((secagg_client, secagg_client.ClientState), (secagg_server, secagg_server.ServerState)):
        states = [getattr(module, n) for n in module.__all__]
        stages = [c.stage for c in states if isinstance(c, type) and issubclass(c, base) and c.stage in set(Stage)]
        assert sorted(stages, key=lambda s: Stage(s).order) == list(Stage)
    with pytest.raises(ValueError, match="masked-input"):
        Stage.parse("masked")


def test_version_rule() -> None:
    assert parse_version("fedmask.v1") == (1, 0) and parse_version("fedmask.v1.3") == (1, 3)
    assert parse_version("v1") is None
    assert version_refusal(PROTOCOL_VERSION) is None and version_refusal("") is None
    old = version_refusal("fedmask.v0.9")
    assert old is not None and "upgrade the edge client" in old
    # a 1.0 client cannot prove possession of its identity key (D32), a 1.1 client does not know the
    # discrete Gaussian (D88): both refused with the advice
    assert PROTOCOL_VERSION == "fedmask.v1.3"
    for older in ("fedmask.v1", "fedmask.v1.1"):
        refusal = version_refusal(older)
        assert refusal is not None and "upgrade the edge client" in refusal
    new = version_refusal("fedmask.v2")
    assert new is not None and "upgrade the coordinator" in new
    weird = version_refusal("\x1b[31m" + "a" * 5000)
    assert weird is not None and len(weird) < 200 and "\x1b" not in weird
    assert coordinator_refusal(PROTOCOL_VERSION) is None and coordinator_refusal("") is None
    assert coordinator_refusal("fedmask.v1.7") is None  # same major: compatible
    refused = coordinator_refusal("fedmask.v2")
    assert refused is not None and "upgrade the edge client" in refused


@pytest.mark.parametrize(("host", "loop"), [("127.0.0.1", True), ("127.9.9.9", True), ("::1", True), ("[::1]", True),
                                            ("localhost", True), ("10.0.0.1", False), ("example.org", False), ("", False)])
def test_is_loopback(host: str, loop: bool) -> None:
    assert is_loopback(host) is loop


@pytest.mark.parametrize(("target", "loop"), [("127.0.0.1:5000", True), ("[::1]:5000", True), ("localhost:1", True),
                                              ("dns:///localhost:1", True), ("ipv4:127.0.0.1:9", True),
                                              ("coordinator.example:443", False), ("10.1.2.3:50051", False)])
def test_is_loopback_target(target: str, loop: bool) -> None:
    assert is_loopback_target(target) is loop
