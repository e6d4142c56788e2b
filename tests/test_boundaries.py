"""Package boundaries of docs/design.md, enforced two ways.

1. An allow-list walk of `secagg`'s source: every import resolves to the
   standard library, numpy, cryptography or secagg itself; and of `dpmech`'s
   (the DP mechanism, a leaf): the standard library, numpy, dp_accounting.
2. import-linter's contracts from pyproject.toml (forbidden and independence
   contracts across all packages), run through its Python API.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[1]
SECAGG_ALLOWED = set(sys.stdlib_module_names) | {"numpy", "cryptography", "secagg", "__future__"}
DPMECH_ALLOWED = set(sys.stdlib_module_names) | {"numpy", "dp_accounting", "dpmech", "__future__"}


def _imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_secagg_imports_only_stdlib_numpy_cryptography() -> None:
    files = sorted((ROOT / "secagg").rglob("*.py"))
    assert files, "secagg has no source files"
    offenders = {
        str(f.relative_to(ROOT)): sorted(_imported_top_levels(f) - SECAGG_ALLOWED) for f in files
    }
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, f"secagg imports outside its allow-list: {offenders}"


def test_dpmech_imports_only_stdlib_numpy_dp_accounting() -> None:
    files = sorted((ROOT / "dpmech").rglob("*.py"))
    assert files, "dpmech has no source files"
    offenders = {str(f.relative_to(ROOT)): sorted(_imported_top_levels(f) - DPMECH_ALLOWED) for f in files}
    assert not {k: v for k, v in offenders.items() if v}, f"dpmech imports outside its allow-list: {offenders}"


def test_allow_list_check_catches_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nfrom grpc import aio\nimport numpy as np\n")
    assert _imported_top_levels(bad) - SECAGG_ALLOWED == {"torch", "grpc"}


def test_import_linter_contracts_hold() -> None:
    # lint_imports reads [tool.importlinter] from pyproject.toml in the cwd. It runs in a
    # process of its own: it configures logging with dictConfig, which would disable the
    # loggers every later test of this process captures (caplog).
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from importlinter.cli import {lint_imports.__name__} as f; raise SystemExit(f())"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert p.returncode == 0, "import-linter contracts are broken (run `.venv/bin/lint-imports`):\n" + p.stdout + p.stderr


def test_admin_reaches_the_coordinator_only_through_its_store() -> None:
    """The admin service is stateless over the coordinator's store and its
    gRPC admin listener: of `coordinator` it imports only `coordinator.store`
    (interface, records, errors, blobs), never the runtime (import-linter's
    forbidden contract cannot say "all but one subpackage")."""
    offenders: dict[str, list[str]] = {}
    for path in sorted((ROOT / "admin").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + ([f"{node.module}.{a.name}" for a in node.names] if node.module == "coordinator" else [])
            bad = [n for n in names if n.split(".")[0] == "coordinator" and not n.startswith("coordinator.store")
                   and n != "coordinator"]
            bad += [n for n in names if n == "coordinator" and isinstance(node, ast.Import)]
            if bad:
                offenders.setdefault(str(path.relative_to(ROOT)), []).extend(bad)
    assert (ROOT / "admin").is_dir()
    assert not offenders, f"admin imports coordinator runtime modules: {offenders}"
