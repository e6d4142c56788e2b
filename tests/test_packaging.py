"""The wheel ships every package: pyproject's explicit package list (no
discovery, so stray folders never ship) names exactly the package folders
git knows under the project's top-level packages.

A package missing from the list installs nowhere but the checkout: the
containers' `import` check fails at image build time, minutes into CI.
"""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_list_names_every_package_folder() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    top_levels = {name.split(".")[0] for name in listed}
    inits = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", "*__init__.py"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()
    found = {".".join(Path(p).parent.parts) for p in inits if Path(p).parts[0] in top_levels}
    assert found, "no package found: is this a git checkout?"
    assert sorted(found - listed) == [], "packages missing from [tool.setuptools] packages"
    assert sorted(listed - found) == [], "listed packages that have no __init__.py"
