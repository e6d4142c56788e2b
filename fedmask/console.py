"""The consoles every `fedmask` command prints through (stdout, stderr, logs).

Contract:

- On a terminal a console is rich's own: as wide as the terminal, long
  lines wrap there.
- Off a terminal (a file or a pipe: CI logs, `make demo > log`) nobody
  reads at a fixed width, so a console is `OFF_TERMINAL_WIDTH` columns wide
  whatever COLUMNS says (COLUMNS describes a terminal, and there is none): a
  table takes the width its content needs and never cuts a header to
  "rou…", and a line of text stays one line.
- Whatever is printed through these consoles must not expand to the
  console's width (`Table(expand=True)`, `Rule`, `Panel`, text justified
  left, right or centre on the whole line): off a terminal that would pad
  every line with spaces up to `OFF_TERMINAL_WIDTH`. A table's title and
  caption are centred on the table, not on the console, and are fine.
- `print_command` prints a command meant to be pasted (a curl line) whole,
  on a line of its own, never wrapped, on a terminal too (the terminal folds
  it for display only; a copy gets one line).
- `log_handler` is the logging handler of a long-running command: rich's
  (columns, colours) on a terminal; off a terminal one plain line per
  record, never wrapped or padded.

Whether a console is on a terminal is its stream's `isatty()`. Rich's own
`Console.is_terminal` also turns true with FORCE_COLOR or FORCE_TERMINAL,
which CI systems set to keep colours in their logs; those still get colours
(rich decides them) but the width of a file.
"""

from __future__ import annotations

import logging
import sys

from rich.console import Console

#: The width of a console off a terminal: wider than any table or line the
#: commands print, so nothing is wrapped or cut.
OFF_TERMINAL_WIDTH = 1000


def on_terminal(console: Console) -> bool:
    """Whether `console` writes to a terminal (its stream's isatty)."""
    try:
        return bool(console.file.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def _console(*, stderr: bool) -> Console:
    console = Console(stderr=stderr)
    if not on_terminal(console):
        console.width = OFF_TERMINAL_WIDTH
    return console


def out() -> Console:
    """A console on stdout (tables, reports); see the module doc."""
    return _console(stderr=False)


def err() -> Console:
    """A console on stderr (progress, errors); see the module doc."""
    return _console(stderr=True)


def print_command(console: Console, command: str) -> None:
    """Print `command` (plain text, no markup) whole on one line of its own, never wrapped."""
    console.print(command, soft_wrap=True, markup=False, highlight=False)


def log_handler() -> logging.Handler:
    """The handler of a command's log records on stdout; see the module doc.
    Records carry their own message only (the handler adds time and level)."""
    console = out()
    if on_terminal(console):
        from rich.logging import RichHandler

        return RichHandler(console=console, show_path=False, rich_tracebacks=False, markup=False)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-8s %(message)s", datefmt="%H:%M:%S"))
    return handler


__all__ = ["OFF_TERMINAL_WIDTH", "err", "log_handler", "on_terminal", "out", "print_command"]
