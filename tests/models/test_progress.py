"""models/sim/progress.py: plain lines when not a terminal, a bar on one."""

from __future__ import annotations

import io

import pytest

from models.sim.progress import Progress


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_lines_every_interval_with_an_estimate() -> None:
    out, clock = io.StringIO(), Clock()
    with Progress("grid", total=4, unit="fit", stream=out, interval=10, clock=clock) as p:
        clock.t += 5
        p.advance(status="a")  # 5 s after the start line: too soon for a line
        clock.t += 6
        p.advance(status="b")  # 11 s: a line, 2 of 4 done in 11 s -> ~11 s left
        clock.t += 1
        p.advance()
    lines = out.getvalue().splitlines()
    assert lines[0] == "[progress] grid: 0/4 fit, 0.0 s elapsed, ~? left (started)"
    assert lines[1] == "[progress] grid: 2/4 fit, 11.0 s elapsed, ~11.0 s left (b)"
    assert lines[2] == "[progress] grid: 3/4 fit, 12.0 s elapsed, ~4.0 s left (done)"
    assert len(lines) == 3


def test_auto_mode_and_errors() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    p = Progress("x", total=2, stream=tty)
    assert p.mode == "bar"
    p.advance(status="s")
    p.close()
    assert "x" in tty.getvalue() and "[progress]" not in tty.getvalue()
    assert Progress("x", stream=io.StringIO(), mode="off").mode == "off"
    log = io.StringIO()
    with pytest.raises(KeyError):
        with Progress("job", total=None, stream=log, interval=0):
            raise KeyError("boom")
    assert log.getvalue().splitlines()[-1].endswith("(stopped: KeyError)")
    assert "left" not in log.getvalue()  # no total, no estimate
    with pytest.raises(ValueError, match="interval"):
        Progress("x", interval=-1)
