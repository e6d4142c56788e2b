"""The typing gate: mypy, configured in pyproject.toml, passes on the whole tree.

Runs mypy in-process (`mypy.api.run`) with its incremental cache in the
git-ignored `.mypy_cache/` folder at the repository root, so that a warm run
only re-checks what changed. The test fails listing every error mypy reports.

`[tool.mypy] files` names what is checked. Two files are checked in runs of
their own because they would clash with tests/conftest.py as the top-level
module `conftest` (the test folders are not packages): see `SEPARATE`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mypy import api

REPO = Path(__file__).resolve().parents[1]

# Excluded from the main run by `[tool.mypy] exclude`; each is checked alone.
SEPARATE = ("tests/coordinator/conftest.py", "tests/integration/conftest.py")


def _mypy(*targets: str) -> tuple[str, int]:
    """mypy's report and exit status for `targets` (none: the configured files)."""
    cwd = os.getcwd()
    os.chdir(REPO)  # the config's relative paths and the cache are the repo's
    try:
        stdout, stderr, status = api.run(["--config-file", str(REPO / "pyproject.toml"), *targets])
    finally:
        os.chdir(cwd)
    return stdout + stderr, status


@pytest.mark.parametrize("targets", [(), *((path,) for path in SEPARATE)], ids=["tree", *SEPARATE])
def test_mypy_reports_no_error(targets: tuple[str, ...]) -> None:
    report, status = _mypy(*targets)
    assert status == 0, f"mypy found type errors:\n{report}"
    assert "Success: no issues found" in report, report
