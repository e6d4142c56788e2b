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
    device_ca: Annotated[bool, typer.Option(help="Also create the device CA (device-ca.pem/.key), which signs device identity certificates.")] = True,
    device_ca_only: Annotated[bool, typer.Option("--device-ca-only", help="Create only the device CA (for an operator who keeps it on another machine than the coordinator's CA).")] = False,
) -> None:
    """Create (or complete) a CA, a coordinator certificate, N device TLS certificates and the device CA.

    Existing files are kept unless --force.
    """
    from fedmask.certs import InitReport, PkiLayout, init_device_ca, init_pki

    if device_ca_only:
        report = InitReport(PkiLayout(directory))
        init_device_ca(report.layout, report, force=force)
        for path in report.created:
            typer.echo(f"created  {path}")
        for path in report.kept:
            typer.echo(f"kept     {path}")
        typer.echo(f"\nedge clients: --device-ca {report.layout.device_ca_cert} (never give them device-ca.key)")
        return
    report = init_pki(directory, devices=devices, coordinator_host=coordinator_host, force=force,
                      device_ca=device_ca)
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
        + (f"\nedge clients (active mode): --device-ca {layout.device_ca_cert}; keep device-ca.key off the "
           "coordinator's machine" if device_ca else "")
    )


@certs_app.command("issue-admin")
def issue_admin_cmd(
    directory: Annotated[Path, typer.Argument(help="The PKI directory of `fedmask certs init`.")],
    name: Annotated[str, typer.Argument(help="The admin's name: the certificate's CN (letters, digits, - _ .).")],
) -> None:
    """Issue a client certificate with the admin role (subject OU "admin") for the coordinator's admin listener.

    For --admin-auth mtls. The device listener refuses it, and the admin listener refuses device certificates.
    """
    from fedmask.certs import issue_admin

    try:
        cert, key = issue_admin(directory, name)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    typer.echo(f"created  {cert}\ncreated  {key}")


@certs_app.command("issue-device")
def issue_device(
    requests: Annotated[list[Path], typer.Argument(help="Certificate requests the edge client wrote (STATE_DIR/devices/*/identity-csr.pem).")],
    device_ca_dir: Annotated[Path, typer.Option(help="Directory holding device-ca.pem and device-ca.key.")],
) -> None:
    """Sign device identity certificates with the device CA.

    Each request must be signed by the device's Ed25519 identity key and name its device id; the certificate is written next to it (identity-cert.pem), where the edge client reads it at its next round.
    """
    from fedmask.certs import issue_device_certificates

    try:
        issued = issue_device_certificates(device_ca_dir, requests)
    except (OSError, ValueError) as e:
        raise typer.BadParameter(str(e)) from None
    for path, device_id in issued:
        typer.echo(f"issued   {path}  (device {device_id})")


def register(app: typer.Typer) -> None:
    """Attach `fedmask certs ...` to the root app."""
    app.add_typer(certs_app, name="certs")
