"""The committed stubs package `fedmask_proto/` must be exactly what
`scripts/gen_proto.py` generates from `proto/` with the pinned tools: any
byte difference (stale, hand-edited, missing or extra file) fails."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _load_gen_proto() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fedmask_gen_proto", ROOT / "scripts" / "gen_proto.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_committed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    gen = _load_gen_proto()
    fresh = tmp_path / "fedmask_proto"
    written = gen.generate(fresh)
    assert any(p.name == "coordinator_service_pb2_grpc.py" for p in written)
    diff = gen.differences(fresh, ROOT / "fedmask_proto")
    assert not diff, (
        "fedmask_proto/ drifted from proto/ (run `.venv/bin/python scripts/gen_proto.py`): "
        + ", ".join(diff)
    )


def test_drift_check_notices_a_one_byte_edit(tmp_path: Path) -> None:
    gen = _load_gen_proto()
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        (d / "v1").mkdir(parents=True)
        (d / "v1" / "x_pb2.py").write_bytes(b"x = 1\n")
    (b / "v1" / "x_pb2.py").write_bytes(b"x = 2\n")
    (b / "extra.py").write_bytes(b"")
    assert gen.differences(a, b) == ["extra.py", "v1/x_pb2.py"]


def test_generated_imports_use_the_stub_package() -> None:
    # The rewrite must leave no import of the bare `fedmask.v1` path (which
    # would resolve into the `fedmask` CLI package).
    for path in sorted((ROOT / "fedmask_proto").rglob("*.py*")):
        text = path.read_text(encoding="utf-8")
        assert "from fedmask.v1 " not in text and "import fedmask.v1" not in text, path
