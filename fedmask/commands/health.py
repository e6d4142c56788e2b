"""`fedmask health`: a probe for container healthchecks and Kubernetes exec
probes. Exit 0 when healthy, 1 when not (the reason on stderr), 2 on bad usage.

* ``--address HOST:PORT`` asks grpc.health.v1 Check (the coordinator's
  plaintext health listener, `health_listen_address`, or its main port with
  ``--tls-ca`` and, under mTLS, a client certificate) and is healthy when the
  answer is SERVING.
* ``--client-state DIR`` is healthy when the edge client whose private state
  is DIR has enrolled at least one device with a coordinator (it has reached
  the coordinator and been admitted since the folder was created).
* ``--http URL`` is healthy when a GET of URL answers 2xx (the admin
  service's ``/readyz``; its JSON body says which dependency is down).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer


def _grpc_check(address: str, service: str, timeout: float, tls_ca: Path | None, tls_cert: Path | None,
                tls_key: Path | None, server_name: str | None) -> str | None:
    """None when SERVING, else why not."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    if tls_ca is not None:
        creds = grpc.ssl_channel_credentials(
            root_certificates=tls_ca.read_bytes(),
            private_key=tls_key.read_bytes() if tls_key else None,
            certificate_chain=tls_cert.read_bytes() if tls_cert else None,
        )
        channel = grpc.secure_channel(address, creds, options=options)
    else:
        channel = grpc.insecure_channel(address)
    try:
        # types-grpcio-health-checking declares HealthStub without its methods.
        stub: Any = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    except grpc.RpcError as exc:
        return f"{address}: {exc.code().name}: {exc.details()}"
    finally:
        channel.close()
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return f"{address}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}"
    return None


def _client_check(state_dir: Path) -> str | None:
    path = state_dir / "enrollment.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return f"{path} does not exist yet: no device of this client has enrolled"
    except (OSError, ValueError) as exc:
        return f"{path} is unreadable: {exc}"
    if not isinstance(data, dict) or not any(isinstance(v, dict) and v for v in data.values()):
        return f"{path} lists no enrolled device"
    return None


def _http_check(url: str, timeout: float) -> str | None:
    """None when GET url answers 2xx, else why not (with the start of the body)."""
    import urllib.error
    import urllib.request

    if not url.startswith(("http://", "https://")):
        return f"{url}: not an http(s) URL"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=timeout) as reply:
            reply.read(4096)
            return None
    except urllib.error.HTTPError as exc:
        body = exc.read(500).decode("utf-8", "replace").strip()
        return f"{url}: HTTP {exc.code}" + (f": {body}" if body else "")
    except (urllib.error.URLError, OSError) as exc:
        return f"{url}: {getattr(exc, 'reason', exc)}"


def health(
    address: Annotated[str | None, typer.Option(help="gRPC address HOST:PORT to ask grpc.health.v1 Check.")] = None,
    service: Annotated[str, typer.Option(help="Service name to check ('' = the whole server).")] = "",
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds to wait for the answer.")] = 3.0,
    tls_ca: Annotated[Path | None, typer.Option(help="CA (PEM) of the server's certificate: use TLS.")] = None,
    tls_cert: Annotated[Path | None, typer.Option(help="Client certificate (PEM), when the port requires mTLS.")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="Private key (PEM) of --tls-cert.")] = None,
    tls_server_name: Annotated[str | None, typer.Option(help="Expected name in the server certificate.")] = None,
    client_state: Annotated[Path | None, typer.Option(help="Edge client state folder: healthy once a device has enrolled.")] = None,
    http: Annotated[str | None, typer.Option(help="URL to GET: healthy on a 2xx answer (the admin service's /readyz).")] = None,
) -> None:
    """Probe a coordinator (grpc.health.v1), an edge client (enrolment) or an HTTP endpoint (2xx).

    Exit 0 healthy, 1 not healthy, 2 usage error. For container healthchecks and Kubernetes exec probes.
    """
    if sum(x is not None for x in (address, client_state, http)) != 1:
        typer.echo("fedmask health: give exactly one of --address, --client-state or --http", err=True)
        raise typer.Exit(2)
    if (tls_cert is None) != (tls_key is None):
        typer.echo("fedmask health: --tls-cert and --tls-key go together", err=True)
        raise typer.Exit(2)
    if address is not None:
        problem = _grpc_check(address, service, timeout, tls_ca, tls_cert, tls_key, tls_server_name)
    elif http is not None:
        problem = _http_check(http, timeout)
    else:
        assert client_state is not None
        problem = _client_check(client_state)
    if problem is not None:
        typer.echo(f"unhealthy: {problem}", err=True)
        raise typer.Exit(1)
    typer.echo("healthy")


def register(app: typer.Typer) -> None:
    """Attach `fedmask health` to the root app."""
    app.command("health")(health)
