"""`fedmask certs init DIR`: create the federation's CA, the coordinator's
server certificate and device client certificates; `fedmask certs
issue-admin DIR NAME`: an admin client certificate (see fedmask.certs)."""

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


@certs_app.command("issue-admin")
def issue_admin_cmd(
    directory: Annotated[Path, typer.Argument(help="The PKI directory of `fedmask certs init`.")],
    name: Annotated[str, typer.Argument(help="The admin's name: the certificate's CN (letters, digits, - _ .).")],
) -> None:
    """Issue a client certificate with the admin role (subject OU "admin")
    for the coordinator's admin listener (--admin-auth mtls). The device
    listener refuses it, and the admin listener refuses device certificates."""
    from fedmask.certs import issue_admin

    try:
        cert, key = issue_admin(directory, name)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    typer.echo(f"created  {cert}\ncreated  {key}")


def register(app: typer.Typer) -> None:
    """Attach `fedmask certs ...` to the root app."""
    app.add_typer(certs_app, name="certs")
