"""The `fedmask` console script.

Each package contributes its subcommands from its own module under
`fedmask/commands/`; this file only wires them together so that parallel work
on different packages never edits the same file.
"""

from __future__ import annotations

import os

# A round's big tensors (a cohort's personal tables and updates: GBs at ML-1M's
# size) are fresh memory every round. Asking torch to map allocations of 2 MB and
# more with transparent huge pages halves the time the kernel spends faulting them
# in (docs/decisions.md D77). It only takes effect where the kernel allows
# madvise'd huge pages; a value set by the user wins.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import typer  # noqa: E402

from fedmask.commands import demo as demo_cmd
from fedmask.commands import models as models_cmd
from fedmask.commands import certs as certs_cmd
from fedmask.commands import client as client_cmd
from fedmask.commands import coordinator as coordinator_cmd
from fedmask.commands import bench as bench_cmd
from fedmask.commands import devices as devices_cmd
from fedmask.commands import admin as admin_cmd
from fedmask.commands import health as health_cmd
from fedmask.commands import study as study_cmd
from fedmask.commands import privacy as privacy_cmd
from fedmask.commands import audit as audit_cmd

app = typer.Typer(
    name="fedmask",
    help="Federated recommendation with secure aggregation (Bonawitz / SecAgg+).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

demo_cmd.register(app)
models_cmd.register(app)
certs_cmd.register(app)
client_cmd.register(app)
coordinator_cmd.register(app)
bench_cmd.register(app)
devices_cmd.register(app)
admin_cmd.register(app)
health_cmd.register(app)
study_cmd.register(app)
privacy_cmd.register(app)
audit_cmd.register(app)


def main() -> None:
    app()
