"""Renew docs/admin-dashboard.png: the admin dashboard over the demo's real ML-100K federation.

`make screenshot` runs this. It starts `fedmask demo --keep-running` (a
coordinator, edge-client processes hosting ML-100K users and the admin
service on 127.0.0.1; ML-100K is fetched by the demo when data/ lacks it),
reads the dashboard's address and operator token from the demo's output,
opens the dashboard in headless system Chromium (Debian's chromium and
chromedriver, .ci/ensure-chromium; nothing is downloaded), signs in, waits
until --rounds rounds have committed (so the validation HR@10 curve shows
learning and epsilon has accumulated), asks user-1's device for its top-10
(real movie titles), waits (up to 40 s) for a live round past the share
check in the stage strip and writes the whole page as a PNG.

The demo is started with a few more rounds than the picture waits for, so a
round is still live when the picture is taken; with --keep-running it then
stays up, paused, until this script stops it.

Contract on processes: the demo is started in a session of its own; on
exit (success, error or Ctrl-C) it gets SIGTERM (it then stops every
process it started), then SIGKILL of its process group after a grace
period, and every child of the demo seen while it ran (tracked by PID and
start time from /proc, never by name) that is still alive gets SIGKILL of
its own process group (the demo starts each child in a session of its own).

Exit codes: 0 picture written; 1 the demo or the page failed or timed out
(the demo's last output lines are printed); 2 bad arguments or no
Chromium/chromedriver/selenium (nothing was started).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling module below, also when imported
import headless_chromium  # noqa: E402  (scripts/headless_chromium.py: the driver the browser tests use too)

# the demo prints this line once the admin service is ready
_ACCESS = re.compile(r"dashboard: (http://\S+?)/?\s+\(token: (\S+)\)")
# extra rounds the demo runs beyond those the picture waits for, so a round is live when it is taken
_EXTRA_ROUNDS = 4
# live stages the picture waits for (a while): those after the share check
_LATE_STAGES = ("masked_input", "unmasking", "aggregating")


class Failed(Exception):
    """The run failed; the message says why (exit code 1)."""


class TimedOut(Failed):
    """A wait ran out of time (the demo still running)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="dashboard_screenshot.py",
        description="Screenshot the admin dashboard over the demo's ML-100K federation (fedmask demo) "
                    "with headless system Chromium.")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "admin-dashboard.png",
                   help="PNG to write (default: docs/admin-dashboard.png)")
    p.add_argument("--rounds", type=int, default=12,
                   help="committed rounds to wait for before the picture (default 12)")
    p.add_argument("--devices", type=int, default=450,
                   help="devices the demo hosts, ML-100K users 1..N (default 450, the demo's)")
    p.add_argument("--user", default="user-1", help="user whose top-10 the picture shows (default user-1)")
    p.add_argument("--width", type=int, default=1400, help="page width in CSS pixels (default 1400)")
    p.add_argument("--timeout", type=float, default=900.0,
                   help="seconds to wait for the rounds, the dashboard and the demo in all (default 900)")
    a = p.parse_args(argv)
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    if a.devices < 4:
        p.error("--devices must be at least 4 (the demo's minimum)")
    if not 800 <= a.width <= 4000:
        p.error("--width must be between 800 and 4000")
    if a.timeout <= 0:
        p.error("--timeout must be positive")
    if a.out.suffix.lower() != ".png":
        p.error("--out must name a .png file")
    return a


def check_browser() -> str | None:
    """Why the browser cannot be driven (a message naming the fix), or None."""
    if not headless_chromium.available():
        return (f"no {headless_chromium.CHROMIUM} and {headless_chromium.CHROMEDRIVER}: run .ci/ensure-chromium (installs Debian's chromium and "
                "chromium-driver), or set FEDMASK_CHROMIUM and FEDMASK_CHROMEDRIVER")
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: run `make setup` (the dev extras) or use the project's .venv"
    return None


def say(text: str) -> None:
    print(f"[screenshot {time.strftime('%H:%M:%S')}] {text}", flush=True)


# ------------------------------------------------------------------ the demo


def _start_time(pid: int) -> str | None:
    """The start time (clock ticks since boot) of process `pid`, or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


class Demo:
    """`fedmask demo --keep-running` in a session of its own; its output is
    echoed (round lines) and kept (the tail, for errors); stop() ends it and
    everything it started (see the module doc)."""

    def __init__(self, rounds: int, devices: int) -> None:
        argv = [sys.executable, "-m", "fedmask", "demo", "--rounds", str(rounds), "--devices", str(devices),
                "--keep-running"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.popen = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, errors="replace",
                                      start_new_session=True)
        self.tail: deque[str] = deque(maxlen=40)
        self.access: tuple[str, str] | None = None
        self._children: dict[int, str] = {}  # pid -> start time of every child seen
        self._reader = threading.Thread(target=self._read, name="demo-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            line = raw.rstrip()
            self.tail.append(line)
            m = _ACCESS.search(line)
            if m and self.access is None:
                self.access = (m.group(1), m.group(2))
                say(f"dashboard up at {m.group(1)}/")
            elif line.startswith("round ") or "committed in" in line or "fetching" in line:
                say("demo: " + line)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def watch(self) -> None:
        """Record the demo's children (PID and start time); Failed if the demo exited."""
        for task in Path(f"/proc/{self.popen.pid}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                for pid in map(int, task.read_text().split()):
                    started = _start_time(pid)
                    if started is not None:
                        self._children.setdefault(pid, started)
        if not self.alive():
            raise Failed(f"the demo exited with code {self.popen.returncode}; its last lines:\n" + self.last_lines())

    def last_lines(self) -> str:
        return "\n".join(self.tail)

    def stop(self, grace: float = 30.0) -> None:
        with contextlib.suppress(Failed):
            self.watch()
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, signal.SIGTERM)  # the demo stops its processes on SIGTERM
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                say(f"the demo did not stop within {grace:.0f} s: killing its process group")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(10)
        for pid, started in self._children.items():
            if _start_time(pid) == started:  # the same process, still alive: its own group is killed
                say(f"killing the process group of the demo's child {pid}, still alive")
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
        self._reader.join(5)


# --------------------------------------------------------------- the browser


@contextlib.contextmanager
def chromium(width: int) -> Iterator[Any]:
    """The project's headless Chromium (scripts/headless_chromium.py), `width` pixels wide, scrollbars hidden."""
    with headless_chromium.driver(f"--window-size={width},1000", "--hide-scrollbars") as driver:
        yield driver


def wait(what: str, condition: Callable[[], Any], deadline: float, demo: Demo, every: float = 0.5) -> Any:
    """Poll `condition` until truthy (returned); Failed when the demo exits,
    TimedOut when the deadline (monotonic) passes."""
    from selenium.common.exceptions import StaleElementReferenceException

    while True:
        demo.watch()
        try:
            got = condition()
        except StaleElementReferenceException:
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimedOut(f"timed out waiting for {what}; the demo's last lines:\n" + demo.last_lines())
        time.sleep(every)


def take(args: argparse.Namespace, demo: Demo, deadline: float) -> None:
    from selenium.webdriver.common.by import By

    base, token = wait("the demo to print the dashboard's address", lambda: demo.access, deadline, demo)
    with chromium(args.width) as d:
        d.get(base + "/")
        d.find_element(By.ID, "token-input").send_keys(token)
        d.find_element(By.ID, "token-form").submit()
        wait("the dashboard to sign in", lambda: not d.find_element(By.ID, "app").get_attribute("hidden"),
             deadline, demo)
        say(f"signed in; waiting for {args.rounds} committed rounds")

        seen = [-1]

        def committed() -> bool:
            n = len(d.find_elements(By.CSS_SELECTOR, "#rounds-table td.committed"))
            if n != seen[0]:
                seen[0] = n
                say(f"dashboard shows {n} of {args.rounds} committed rounds")
            return n >= args.rounds

        wait(f"{args.rounds} committed rounds", committed, deadline, demo, every=1.0)
        wait("epsilon in the live card", lambda: "epsilon" in d.find_element(By.ID, "privacy").text,
             deadline, demo)
        # Under DP (the demo's default) the devices send no validation totals (D36), and the
        # validation chart says so in words; the duration and epsilon charts are drawn either way.
        def charts_drawn() -> bool:
            lines = len(d.find_elements(By.CSS_SELECTOR, ".chart polyline"))
            return lines == 3 or (lines == 2 and "off under DP" in d.find_element(By.ID, "chart-val").text)

        wait("the charts (validation, or why there is none; duration; epsilon)", charts_drawn, deadline, demo)

        say(f"asking {args.user}'s device for its top-10")
        d.find_element(By.ID, "topk-user").send_keys(args.user)
        d.find_element(By.ID, "topk-form").submit()
        rows = lambda: d.find_elements(By.CSS_SELECTOR, "#topk-results tbody tr")  # noqa: E731
        wait("the top-10 with titles", lambda: len(rows()) == 10 and all(
            r.find_elements(By.TAG_NAME, "td")[2].text.strip() for r in rows()), deadline, demo)

        d.execute_script("document.activeElement.blur()")  # no focus ring on the form in the picture

        def fit() -> int:
            """The viewport set to the page's whole height (so one screenshot holds it all)."""
            height = int(d.execute_script("return document.documentElement.scrollHeight"))
            d.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                              {"width": args.width, "height": height, "deviceScaleFactor": 1, "mobile": False})
            return height

        fit()
        time.sleep(0.5)  # the charts re-laid out at the new size
        # a round past the share check makes the picture (the stages before it done, with their counts);
        # after a short wait, any live stage, or none (the demo paused after its rounds)
        active = lambda: d.find_elements(By.CSS_SELECTOR, "#stage-strip li.active")  # noqa: E731

        refreshed = [0.0]

        def late() -> bool:
            """A stage past the share check is live, in the round the table shows running, and the header's
            phase says that stage. The live card (event stream), the table and the header (polled every 5 s)
            are refreshed apart, so the page's own refreshAll() is called once a second until they agree:
            a moment where they disagree is not pictured."""
            stage = [li.get_attribute("data-stage") for li in active()]
            top = d.find_elements(By.CSS_SELECTOR, "#rounds-table tbody tr")[:1]
            if (stage and stage[0] in _LATE_STAGES and top and "running" in top[0].text
                    and d.find_element(By.ID, "live-number").text == "#" + str(top[0].get_attribute("data-round"))
                    and d.find_element(By.ID, "phase").text == stage[0]):
                return True
            if time.monotonic() - refreshed[0] >= 1.0:
                refreshed[0] = time.monotonic()
                d.execute_script("refreshAll()")
            return False

        say("waiting (up to 40 s) for a live round past the share check")
        with contextlib.suppress(TimedOut):
            wait("a live stage past the share check", late, min(deadline, time.monotonic() + 40), demo, every=0.1)
        height = fit()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if not d.save_screenshot(str(args.out)):
            raise Failed(f"Chromium could not write {args.out}")
        stage = [li.get_attribute("data-stage") for li in active()]
        say(f"wrote {args.out} ({args.width}x{height}; live stage: {stage[0] if stage else 'none'})")


def _interrupt(*_: object) -> None:
    """SIGTERM is handled like Ctrl-C: the demo is still stopped."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out = args.out.resolve()
    problem = check_browser()
    if problem:
        print(f"dashboard_screenshot: {problem}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    say(f"starting fedmask demo: {args.devices} devices, {args.rounds + _EXTRA_ROUNDS} rounds, --keep-running")
    demo = Demo(args.rounds + _EXTRA_ROUNDS, args.devices)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        take(args, demo, t0 + args.timeout)
    except Failed as exc:
        print(f"dashboard_screenshot: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("dashboard_screenshot: interrupted", file=sys.stderr)
        return 130
    finally:
        say("stopping the demo and every process it started")
        demo.stop()
        signal.signal(signal.SIGTERM, previous)
    say(f"done in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
