"""The harness lists the processes a test started, descendants included, and
only those (integration_harness.tagged_processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

from integration_harness import PROCESS_TAG, tagged_processes, wait_until

# a child that starts a grandchild in a session of its own, prints its pid and exits: an orphan
SPAWN = ("import subprocess, sys; "
         "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True, "
         "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
         "print(g.pid, flush=True)")


def test_an_orphaned_grandchild_in_its_own_session_is_listed_and_others_are_not() -> None:
    tag = uuid.uuid4().hex
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env={**os.environ, PROCESS_TAG: uuid.uuid4().hex})  # another test's process
    try:
        done = subprocess.run([sys.executable, "-c", SPAWN], env={**os.environ, PROCESS_TAG: tag},
                              capture_output=True, text=True, timeout=30, check=True)
        grandchild = int(done.stdout.split()[0])
        try:
            assert set(tagged_processes(tag)) == {grandchild}
            assert other.pid not in tagged_processes(tag) and os.getpid() not in tagged_processes(tag)
        finally:
            os.kill(grandchild, signal.SIGKILL)
        wait_until(lambda: not tagged_processes(tag), 10, what="the grandchild gone")
    finally:
        other.kill()
        other.wait(10)
