"""`fedmask certs init DIR`: create the federation's CA, the coordinator's
server certificate and device client certificates (see fedmask.certs)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

certs_app = typer.Typer(help="TLS certificates for mTLS between coordinator and edge clients.",
                        no_args_is_help=True)


@certs_app.command("init")
def init(
    directory: Annotated[Path, typer.Argument(help="Directory to write the PEM files into.")],
    devices: Annotated[int, typer.Option(min=0, help="Number of device client certificates.")] = 0,
    coordinator_host: Annotated[
        str, typer.Option(help="Extra DNS name or IP of the coordinator for the server certificate SAN.")
    ] = "localhost",
    force: Annotated[bool, typer.Option(help="Regenerate everything, including a new CA.")] = False,
) -> None:
    """Create (or complete) a CA, a coordinator certificate and N device
    certificates. Existing files are kept unless --force."""
    from fedmask.certs import init_pki

    report = init_pki(directory, devices=devices, coordinator_host=coordinator_host, force=force)
    for path in report.created:
        typer.echo(f"created  {path}")
    for path in report.kept:
        typer.echo(f"kept     {path}")
    layout = report.layout
    typer.echo(
        "\ncoordinator (env or [tls] in its TOML file):\n"
        f"  FEDMASK_TLS__CERT={layout.server_cert} FEDMASK_TLS__KEY={layout.server_key}\n"
        f"  FEDMASK_TLS__CLIENT_CA={layout.ca_cert} FEDMASK_TLS__REQUIRE_CLIENT_CERT=true FEDMASK_AUTH__MODE=mtls\n"
        f"edge client N: {layout.devices_dir}/device-NNNN.pem + .key, trusting {layout.ca_cert}"
    )


def register(app: typer.Typer) -> None:
    """Attach `fedmask certs ...` to the root app."""
    app.add_typer(certs_app, name="certs")
