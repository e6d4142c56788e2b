"""What starts without torch: `fedmask --help` and the admin service.

torch costs over a second of start-up (measured with `python -X importtime`),
so the CLI's help and the admin service (which never trains or scores) must
not import it, nor `models`' training code. Each check runs in a fresh
interpreter, so what earlier tests imported does not hide an import.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Runs `body`, then prints which heavy modules the interpreter loaded.
PROBE = """
import json, sys
{body}
heavy = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.") or m in ("dp_accounting", "models.fedrap"))
print(json.dumps(heavy))
"""

HELP = """
sys.argv = ["fedmask", "--help"]
from fedmask.cli import main
try:
    main()
except SystemExit:
    pass
"""


def _heavy_modules(body: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(body=body)],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=120,
    ).stdout
    result: list[str] = json.loads(out.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize(
    "body",
    [HELP, "import admin.app\nadmin.app.create_app"],
    ids=["fedmask --help", "admin.app"],
)
def test_starts_without_torch(body: str) -> None:
    assert _heavy_modules(body) == []


def test_the_probe_sees_torch_when_it_is_imported() -> None:
    assert "torch" in _heavy_modules("import models.fedrap")
