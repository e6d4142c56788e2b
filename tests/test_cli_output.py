"""What the `fedmask` commands print stays readable off a terminal (a CI log,
`make demo > log`): tables as wide as their content (no header cut with an
ellipsis), commands meant to be pasted whole on one line, log records one
plain line each (fedmask/console.py), and command help written for the
typer/rich panel (no hard line break inside a paragraph)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from fedmask import console as cli_console
from fedmask.cli import app

# what a CI runner without a terminal gets: rich's fallback width, 80 columns
CI_ENV = {"COLUMNS": "80"}


@pytest.fixture
def off_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """stdout and stderr are pytest's captures (not terminals), with the
    width a terminal-less CI run reports."""
    for name, value in CI_ENV.items():
        monkeypatch.setenv(name, value)


def _round(number: int, *, dropped_masked: int, dropped_unmasking: int) -> Any:
    selected = list(range(30))
    after_masked = selected[dropped_masked:]
    after_unmasking = after_masked[dropped_unmasking:]
    started = datetime(2024, 1, 1, tzinfo=timezone.utc)
    return SimpleNamespace(
        number=number,
        state=SimpleNamespace(value="committed"),
        abort_reason=None,
        started_at=started,
        ended_at=started + timedelta(seconds=7.7),
        base_model_version=number,
        survivors={"selected": selected, "advertise_keys": selected, "share_keys": selected,
                   "share_check": selected, "masked_input": after_masked, "unmasking": after_unmasking},
        dropouts={"masked_input": selected[:dropped_masked], "unmasking": after_masked[:dropped_unmasking]},
        timings={"advertise_keys": 1.54, "share_keys": 0.08, "share_check": 0.05, "masked_input": 0.03,
                 "unmasking": 3.0, "aggregating": 0.01},
        metrics={"contributors": len(after_unmasking), "count.devices": len(after_unmasking),
                 "count.examples": 828.0, "val_hr@10": 0.077, "val_ndcg@10": 0.027,
                 "count.clipped": float(len(after_unmasking))},
    )


def test_the_demo_tables_off_a_terminal_keep_every_header_whole(off_terminal: None,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from fedmask.commands.demo import _metrics_table, _stage_table

    records = [_round(1, dropped_masked=4, dropped_unmasking=2), _round(2, dropped_masked=3, dropped_unmasking=5)]
    store = SimpleNamespace(
        list_model_versions=lambda limit: SimpleNamespace(
            items=[SimpleNamespace(round_number=r.number, id=r.number + 1) for r in records]),
        privacy_ledger=lambda: [SimpleNamespace(round_number=r.number, epsilon=5.13, cumulative_epsilon=7.62)
                                for r in records],
    )
    console = cli_console.out()
    assert console.width == cli_console.OFF_TERMINAL_WIDTH  # COLUMNS describes a terminal; there is none
    console.print(_stage_table(records))
    console.print(_metrics_table(records, store))
    text = capsys.readouterr().out
    assert "…" not in text and "..." not in text, text
    words = {w for line in text.splitlines() for w in line.split()}
    for header in ("round", "selected", "advertise", "unmasking", "commit", "total", "model", "examples",
                   "HR@10", "NDCG@10", "clipped", "epsilon"):
        assert header in words, (header, text)
    # every row of a round on one line: the second round's cells side by side
    assert any(line.split()[:2] == ["2", "30"] and line.rstrip().endswith("7.7 s") for line in text.splitlines()), text
    assert all(line == line.rstrip() or len(line) < 200 for line in text.splitlines())  # nothing padded to the width


def test_the_demo_prints_its_curl_line_whole_on_a_line_of_its_own(off_terminal: None,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from fedmask.commands.demo import _print_access
    from fedmask.commands.demo_product import AdminService

    admin = AdminService(child=None, base="http://127.0.0.1:54321", token="t" * 43)  # type: ignore[arg-type]
    _print_access(cli_console.out(), admin)
    lines = capsys.readouterr().out.splitlines()
    assert admin.curl_top_k("user-1") in lines, lines
    assert f"dashboard: {admin.base}/  (token: {admin.token})" in lines


def test_print_command_never_wraps_on_a_narrow_console(capsys: pytest.CaptureFixture[str]) -> None:
    from rich.console import Console

    command = "curl -X POST -H 'Authorization: Bearer " + "t" * 43 + "' http://127.0.0.1:1/v1/federation/resume"
    cli_console.print_command(Console(width=40), command)
    assert capsys.readouterr().out == command + "\n"


def test_log_records_off_a_terminal_are_one_plain_line_each(off_terminal: None,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    handler = cli_console.log_handler()
    message = "; ".join(["enrolled 15 devices with the coordinator at 127.0.0.1:50051"] * 3)
    handler.handle(logging.LogRecord("edge_client", logging.WARNING, __file__, 1, message, None, None))
    (line,) = capsys.readouterr().out.splitlines()
    assert line.endswith(" WARNING  " + message), line


# --------------------------------------------------------------------------- help texts


def _commands(cmd: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _commands(sub, (*path, name))


ALL_COMMANDS = list(_commands(typer.main.get_command(app)))


def _help(path: tuple[str, ...], columns: int) -> str:
    out = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(columns), "NO_COLOR": "1"})
    assert out.exit_code == 0, out.output
    return out.output


def _description(text: str) -> list[list[str]]:
    """The paragraphs (lists of lines, stripped) between the usage line and the first panel."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("Usage:")) + 1
    paragraphs: list[list[str]] = [[]]
    for line in lines[start:]:
        if line.lstrip().startswith("╭"):
            break
        if line.strip():
            paragraphs[-1].append(line.strip())
        elif paragraphs[-1]:
            paragraphs.append([])
    return [p for p in paragraphs if p]


@pytest.mark.parametrize("path", ALL_COMMANDS, ids=lambda p: " ".join(("fedmask", *p)))
def test_help_paragraphs_have_no_hard_line_breaks(path: tuple[str, ...]) -> None:
    """Wide enough that rich wraps nothing, every paragraph of a command's
    description is one line: a second line can only be a line break written
    into the help text."""
    paragraphs = _description(_help(path, 1000))
    assert paragraphs, path
    assert all(len(p) == 1 for p in paragraphs), paragraphs


@pytest.mark.parametrize("path", [("coordinator",), ("client",), ("simulate",), ("demo",), ("admin",)],
                         ids=lambda p: p[0])
def test_help_at_100_columns_fills_its_lines(path: tuple[str, ...]) -> None:
    """At 100 columns a paragraph breaks a line only where its next word
    would not fit (a few columns of slack for the panel's margins)."""
    for paragraph in _description(_help(path, 100)):
        for line, following in zip(paragraph, paragraph[1:], strict=False):
            assert len(line) + 1 + len(following.split()[0]) > 100 - 6, (line, following)


def test_the_command_list_gives_each_command_one_line() -> None:
    text = _help((), 1000)
    panel = text.split("Commands")[1].splitlines()[1:]
    rows = [line for line in panel if line.startswith("│")]
    assert len(rows) == len({p[0] for p in ALL_COMMANDS if p}), text
    assert all(not row[1:].startswith("  ") for row in rows), text  # no continuation line


def test_help_shows_square_brackets_rich_would_take_for_markup() -> None:
    assert "in the [limits] table of the TOML file" in " ".join(_help(("coordinator",), 1000).split())
