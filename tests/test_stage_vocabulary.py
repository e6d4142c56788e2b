"""One stage vocabulary: every list of protocol stages in the repository is
secagg's `Stage`, in protocol order (secagg/stages.py).

The lists derived by iterating `Stage` are compared with it here; the enum
that spells its members (so the type checker knows them), the store's
`RoundState`, which is also the round machine's phase, checks itself when
imported (`check_mirrors_stages`), and that check is shown to refuse a
drifted list. The dashboard's strip is checked where it is
served (tests/admin/test_admin_api.py).
"""

from __future__ import annotations

import enum
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from admin import history, schemas
from coordinator import live_state
from coordinator.rounds import PHASES
from coordinator.store import RoundState
from fedmask_proto.v1 import admin_service_pb2 as A
from secagg import bench
from secagg.stages import CLI_NAMES, Stage, check_mirrors_stages
from wire import round_task

ROOT = Path(__file__).resolve().parents[1]
VALUES = [s.value for s in Stage]
NAMES = [s.name for s in Stage]


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


def _stage_members(cls: type[enum.Enum]) -> list[str]:
    return [m.name for m in cls if m.value in VALUES]


def test_the_protocol_has_the_share_check() -> None:
    assert VALUES == ["advertise_keys", "share_keys", "share_check", "masked_input", "consistency_check",
                      "unmasking"]


def test_round_phases_are_the_stages_then_aggregation_and_the_ends() -> None:
    assert [p.value for p in PHASES] == [*VALUES, "aggregating", "committed", "aborted"]
    assert all(isinstance(p, RoundState) for p in PHASES)
    assert [p.stage for p in PHASES if p.is_collecting] == list(Stage)


def test_stored_round_states_are_selection_training_the_stages_then_aggregation_and_the_ends() -> None:
    assert [s.value for s in RoundState] == ["selecting", "training", *VALUES, "aggregating", "committed", "aborted"]
    assert _stage_members(RoundState) == NAMES
    assert [s.stage for s in RoundState if s.is_collecting] == list(Stage)
    assert all(s.stage is None for s in RoundState if not s.is_collecting)


def test_the_live_state_names_every_phase_in_the_proto() -> None:
    assert list(live_state.STAGE) == [p.value for p in PHASES]
    assert {A.RoundStage.Name(v) for v in live_state.STAGE.values()} == {
        n for n in A.RoundStage.keys() if n != "ROUND_STAGE_UNSPECIFIED"}
    assert all(A.RoundStage.Name(v) == f"ROUND_STAGE_{p.name}" for p, v in zip(PHASES, live_state.STAGE.values(),
                                                                             strict=True))


def test_the_admin_service_shows_every_stage() -> None:
    assert list(schemas.ROUND_STAGES) == [*VALUES, "aggregating"]
    assert list(history.STAGE_ORDER) == ["selected", "training", *VALUES, "aggregating"]
    assert schemas.Federation.model_fields["round_stages"].get_default(call_default_factory=True) == [
        *VALUES, "aggregating"]


def test_the_deadline_lists_and_the_benches_name_every_stage() -> None:
    assert list(round_task.STAGES) == VALUES
    assert list(bench.STAGE_CHOICES) == ["none", *CLI_NAMES]
    assert "share-check" in bench.STAGE_CHOICES
    assert list(_script("bench_hybrid_round").DEADLINES) == VALUES


def test_a_drifted_mirror_of_the_stages_is_refused() -> None:
    check_mirrors_stages(["selecting", *VALUES, "aggregating"], owner="ok")
    without_share_check = [v for v in VALUES if v != "share_check"]
    swapped = [VALUES[1], VALUES[0], *VALUES[2:]]
    split = [*VALUES[:2], "training", *VALUES[2:]]
    twice = [*VALUES, VALUES[0]]
    for drifted in (without_share_check, swapped, split, twice, []):
        with pytest.raises(TypeError, match="Drifted"):
            check_mirrors_stages(drifted, owner="Drifted")
