"""Kill points for the fault tests (D94), in no shipped code: a process
gets them only when a test puts this folder first on its PYTHONPATH (Python
imports `sitecustomize` at start-up) and names one in
INTEGRATION_TESTS_KILL_POINT (outside the FEDMASK_ settings prefix).

  unmasking_answered  the coordinator SIGKILLs itself right after it
                      handled the first unmasking answer of a round: its
                      unmasking requests went out and at least one device
                      spent its contribution to the version (D85)
"""

from __future__ import annotations

import os
import signal
from typing import Any

KILL_POINT = "INTEGRATION_TESTS_KILL_POINT"

if os.environ.get(KILL_POINT) == "unmasking_answered":
    from coordinator import service

    _handle = service.Coordinator._on_stage_message

    def _then_die(self: service.Coordinator, session: Any, inner: object) -> None:
        _handle(self, session, inner)
        if type(inner).__name__ == "UnmaskingResponse":
            os.kill(os.getpid(), signal.SIGKILL)

    setattr(service.Coordinator, "_on_stage_message", _then_die)
