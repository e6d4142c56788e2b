"""docs/architecture.md states each package's real imports, and nothing in
the repository's docs points outside the repository."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("secagg", "models", "wire", "fedmask_proto", "fedmask_settings", "coordinator", "edge_client", "admin",
            "fedmask", "dpmech")
_STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def real_imports(package: str) -> set[str]:
    """Top-level names a package imports, besides the standard library and itself."""
    names: set[str] = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names - _STDLIB - {package}


def documented_imports() -> dict[str, set[str]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    table: dict[str, set[str]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"`\w+`", cells[0]):
            table[cells[0].strip("`")] = set(re.findall(r"`(\w+)`", cells[2]))
    return table


def test_architecture_lists_every_package_and_its_real_imports() -> None:
    documented = documented_imports()
    assert set(documented) == set(PACKAGES)
    wrong = {p: {"documented": sorted(documented[p]), "real": sorted(real_imports(p))}
             for p in PACKAGES if documented[p] != real_imports(p)}
    assert not wrong, f"docs/architecture.md's import table is out of date: {wrong}"


def test_docs_refer_to_nothing_outside_the_repository() -> None:
    tracked = subprocess.run(["git", "ls-files", "README.md", "docs", "deploy"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    offenders = [f"{name}:{i}" for name in tracked if name.endswith(".md")
                 for i, line in enumerate((ROOT / name).read_text().splitlines(), 1) if "../shared" in line]
    assert not offenders, offenders


def test_the_readme_stays_an_entry_page() -> None:
    """README.md is the entry page (at most 25 KB, opening with the two
    commands); measured tables live in docs/performance.md."""
    readme = (ROOT / "README.md").read_bytes()
    assert len(readme) <= 25_000, f"README.md is {len(readme)} bytes; move detail to docs/"
    head = readme.decode()[:3000]
    assert "make demo" in head and "make test" in head
