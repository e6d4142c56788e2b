"""scripts/dashboard_screenshot.py (`make screenshot`) without a run: its
help, its argument checks and its error when Chromium is missing, each
answered before any process is started. The full run (the demo's
federation, two minutes) is not part of the suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "dashboard_screenshot.py"


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})}, check=False)


def test_help_names_the_options() -> None:
    done = _run("--help")
    assert done.returncode == 0
    for option in ("--out", "--rounds", "--devices", "--user", "--width", "--timeout"):
        assert option in done.stdout


@pytest.mark.parametrize(("args", "message"), [
    (("--rounds", "0"), "--rounds must be at least 1"),
    (("--devices", "3"), "--devices must be at least 4"),
    (("--width", "100"), "--width must be between"),
    (("--out", "picture.jpg"), "--out must name a .png file"),
])
def test_bad_arguments_are_refused(args: tuple[str, ...], message: str) -> None:
    done = _run(*args)
    assert done.returncode == 2
    assert message in done.stderr


def test_missing_chromium_points_at_the_installer(tmp_path: Path) -> None:
    done = _run("--out", str(tmp_path / "shot.png"), env={"FEDMASK_CHROMIUM": str(tmp_path / "no-chromium")})
    assert done.returncode == 2
    assert ".ci/ensure-chromium" in done.stderr
    assert "starting fedmask demo" not in done.stdout  # nothing was started
    assert not (tmp_path / "shot.png").exists()
