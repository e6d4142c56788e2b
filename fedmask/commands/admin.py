"""`fedmask admin`: the admin service (FastAPI on uvicorn), and `fedmask
admin-token`: make an API token and the settings entry holding its hash.

Flags override the matching setting of admin.settings (flags >
FEDMASK_ADMIN_* environment > TOML file > defaults). Secrets (the API
tokens' hashes and the coordinator credential) come from the environment
or the file only, never from a flag.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

_EXAMPLE = """\b
Example config (admin.toml):
  listen_address = "127.0.0.1:8080"
  database_url = "sqlite:///./fedmask.db"
  \\[coordinator]
  address = "127.0.0.1:50052"   # the coordinator's ADMIN listener
  # token: env FEDMASK_ADMIN_COORDINATOR__TOKEN
  \\[limits]                       # what one request may cost (defaults)
  max_header_bytes = 16384
  max_body_bytes = 16384          # routes without a body take none
  max_concurrent_requests = 64
  request_timeout_s = 30
  \\[event_streams]                # who holds the /v1/events streams (defaults)
  max_streams = 32
  per_token = 4
  operator_reserved = 4
  \\[\\[tokens]]                     # from `fedmask admin-token NAME ROLE`
  name = "ops"
  role = "operator"
  sha256 = "..."
"""


def admin(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML settings file (else $FEDMASK_ADMIN_CONFIG).")] = None,
    listen: Annotated[str | None, typer.Option(help="HTTP listen address HOST:PORT (default 127.0.0.1:8080).")] = None,
    database_url: Annotated[str | None, typer.Option(help="The coordinator's store, read only: sqlite:///FILE or postgresql+psycopg://... (default sqlite:///./fedmask.db).")] = None,
    coordinator: Annotated[str | None, typer.Option(help="The coordinator's admin listener HOST:PORT (default 127.0.0.1:50052).")] = None,
    coordinator_ca: Annotated[Path | None, typer.Option(help="CA bundle (PEM) of the admin listener's certificate; enables TLS.")] = None,
    topk_timeout: Annotated[float | None, typer.Option(help="Seconds the coordinator waits for a device's top-k answer (default 5).")] = None,
    log_level: Annotated[str, typer.Option(help="Logging level: DEBUG, INFO, WARNING, ERROR.")] = "INFO",
) -> None:
    """Run the admin service: REST API under /v1, dashboard at /, /metrics, /healthz, /readyz.

    Stateless (run several behind a load balancer): history comes from the coordinator's store, read only; live state, events, top-k and operator actions from the coordinator's admin listener. Every route but /healthz, /readyz and the dashboard page needs `Authorization: Bearer <token>`.
    """
    import logging

    from admin.app import create_app
    from admin.settings import AdminSettings, SettingsError
    from coordinator.store import StoreError
    from fedmask.commands.admin_http import serve

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = AdminSettings.load(config_file=config, overrides={
            "listen_address": listen, "database_url": database_url, "coordinator.address": coordinator,
            "coordinator.tls_ca": str(coordinator_ca) if coordinator_ca else None,
            "coordinator.topk_timeout_s": topk_timeout})
    except SettingsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if not settings.tokens:
        typer.echo("warning: no API tokens configured: every route but /healthz and /readyz answers 401 "
                   "(add some with `fedmask admin-token`)", err=True)
    try:
        app = create_app(settings)
    except StoreError as exc:
        typer.echo(f"error: cannot open the store: {exc}", err=True)
        raise typer.Exit(2) from None
    serve(app, settings, log_level=log_level)


def admin_token(
    name: Annotated[str, typer.Argument(help="Who holds the token (shown as the actor in the audit log).")],
    role: Annotated[str, typer.Argument(help="viewer (read), recommender (top-k) or operator (everything).")],
    stdin: Annotated[bool, typer.Option("--stdin", help="Read the token from standard input instead of making one.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the entry as JSON (for FEDMASK_ADMIN_TOKENS).")] = False,
) -> None:
    """Make a random API token; print it once (stderr) and its settings entry (stdout).

    The settings keep only the SHA-256 of a token; store the token itself where its holder keeps secrets.
    """
    from admin.auth import check_new_token, new_token, token_hash
    from admin.settings import Role, TokenEntry

    try:
        entry_role = Role(role)
    except ValueError:
        raise typer.BadParameter(f"role must be one of {', '.join(r.value for r in Role)}") from None
    token = sys.stdin.readline().strip() if stdin else new_token()
    try:
        check_new_token(token)
        entry = TokenEntry(name=name, role=entry_role, sha256=token_hash(token))
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if not stdin:
        typer.echo(f"token (shown once): {token}", err=True)
    if as_json:
        typer.echo(json.dumps(entry.model_dump(mode="json")))
    else:
        typer.echo(f'[[tokens]]\nname = "{entry.name}"\nrole = "{entry.role.value}"\nsha256 = "{entry.sha256}"')


def register(app: typer.Typer) -> None:
    """Attach `fedmask admin` and `fedmask admin-token` to the root app."""
    app.command("admin", epilog=_EXAMPLE)(admin)
    app.command("admin-token")(admin_token)
