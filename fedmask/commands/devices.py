"""`fedmask devices`: list, revoke and restore enrolled devices in the
coordinator's store. A running coordinator applies a revocation within half
a heartbeat interval: the device leaves its stream, is no longer selected or
counted, and is refused at its next Hello or CheckIn."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:  # the coordinator package is imported lazily (the CLI's start-up time)
    from coordinator.store import Store

devices_app = typer.Typer(help="Operator actions on enrolled devices (the coordinator's store).", no_args_is_help=True)

_DB = typer.Option("--database-url", envvar="FEDMASK_DATABASE_URL",
                   help="The coordinator's store: sqlite:///FILE or postgresql+psycopg://... (env FEDMASK_DATABASE_URL).")


def register(app: typer.Typer) -> None:
    """Attach `fedmask devices` to the root app."""
    app.add_typer(devices_app, name="devices")


@contextlib.contextmanager
def _store(database_url: str) -> Iterator[Store]:
    """The coordinator's store (not migrated), closed on the way out; exit code 2 when it cannot be opened."""
    from coordinator.store import StoreError, open_store

    try:
        store = open_store(database_url, migrate=False)
    except StoreError as e:
        typer.echo(f"error: cannot open the store: {e}", err=True)
        raise typer.Exit(2) from None
    try:
        yield store
    finally:
        store.close()


def _set(database_url: str, device_ids: list[int], status: str) -> None:
    from coordinator.store import DeviceStatus, NotFoundError

    with _store(database_url) as store:
        for d in device_ids:
            try:
                rec = store.set_device_status(d, DeviceStatus(status))
            except NotFoundError:
                typer.echo(f"error: device {d} is not enrolled", err=True)
                raise typer.Exit(2) from None
            typer.echo(f"device {rec.id} ({rec.local_id or 'no local id'}): {rec.status.value}")


@devices_app.command("revoke")
def revoke(device_ids: Annotated[list[int], typer.Argument(help="Device ids to revoke.")],
           database_url: Annotated[str, _DB] = "sqlite:///./fedmask.db") -> None:
    """Revoke devices: their identity can no longer open a session or be counted."""
    _set(database_url, device_ids, "revoked")


@devices_app.command("restore")
def restore(device_ids: Annotated[list[int], typer.Argument(help="Device ids to make active again.")],
            database_url: Annotated[str, _DB] = "sqlite:///./fedmask.db") -> None:
    """Make revoked devices active again."""
    _set(database_url, device_ids, "active")


@devices_app.command("list")
def list_(database_url: Annotated[str, _DB] = "sqlite:///./fedmask.db") -> None:
    """Every enrolled device: id, status, local id, enrolling client, last seen."""
    with _store(database_url) as store:
        for rec in store.list_devices():
            seen = rec.last_seen_at.isoformat(timespec="seconds") if rec.last_seen_at else "-"
            typer.echo(f"{rec.id}\t{rec.status.value}\t{rec.local_id}\t{rec.client_id or '-'}\t{seen}")
