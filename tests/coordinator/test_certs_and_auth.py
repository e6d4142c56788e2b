"""Certificates from `fedmask certs init` and transport authentication, with
real gRPC servers on 127.0.0.1: mTLS accepts a device certificate and
rejects a client without one (or with a foreign one); the token interceptor
answers UNAUTHENTICATED to calls without the bearer token."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import typer
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from typer.testing import CliRunner

from coordinator.auth import UNAUTHENTICATED_DETAILS, TokenAuthInterceptor, bearer_metadata, peer_common_name
from fedmask.certs import PkiLayout, init_pki, load_certificate, san_hosts
from fedmask.commands import certs as certs_cmd
from fedmask_proto.v1 import coordinator_service_pb2_grpc, enrollment_pb2, session_pb2

TOKEN = "test-token-0123456789abcdef"


class FakeCoordinator(coordinator_service_pb2_grpc.CoordinatorServiceServicer):
    """Enroll echoes the caller's certificate CN; Session echoes heartbeats."""

    async def Enroll(self, request: enrollment_pb2.EnrollRequest, context: Any) -> enrollment_pb2.EnrollResponse:
        return enrollment_pb2.EnrollResponse(
            protocol_version="fedmask.v1", coordinator_version=peer_common_name(context) or "anonymous"
        )

    async def EnrollChallenge(self, request: enrollment_pb2.EnrollChallengeRequest,
                              context: Any) -> enrollment_pb2.EnrollChallengeResponse:
        return enrollment_pb2.EnrollChallengeResponse(challenge=b"c")

    async def Session(self, request_iterator: Any, context: Any) -> AsyncIterator[session_pb2.ServerMessage]:
        async for message in request_iterator:
            yield session_pb2.ServerMessage(heartbeat=message.heartbeat)


async def _serve(credentials: grpc.ServerCredentials | None, interceptors: list[Any] = []) -> tuple[grpc.aio.Server, int]:  # noqa: B006
    server = grpc.aio.server(interceptors=interceptors)
    health_servicer = health.aio.HealthServicer()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    coordinator_service_pb2_grpc.add_CoordinatorServiceServicer_to_server(FakeCoordinator(), server)
    if credentials is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    return server, port


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PkiLayout:
    return init_pki(tmp_path_factory.mktemp("pki"), devices=2, coordinator_host="coord.example").layout


# ------------------------------------------------------------ certificates
def test_init_writes_a_ca_server_and_device_certificates(pki: PkiLayout) -> None:
    ca = load_certificate(pki.ca_cert)
    server = load_certificate(pki.server_cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    server.verify_directly_issued_by(ca)
    assert {"localhost", "127.0.0.1", "coord.example"} <= san_hosts(server)
    assert ExtendedKeyUsageOID.SERVER_AUTH in server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    for index in (1, 2):
        cert_path, key_path = pki.device(index)
        device = load_certificate(cert_path)
        device.verify_directly_issued_by(ca)
        assert device.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == f"device-000{index}"
        eku = device.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert ExtendedKeyUsageOID.CLIENT_AUTH in eku and ExtendedKeyUsageOID.SERVER_AUTH not in eku
        assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    for key in (pki.ca_key, pki.server_key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert b"PRIVATE KEY" in pki.ca_key.read_bytes()


def test_init_is_idempotent_and_adds_missing_devices(tmp_path: Path) -> None:
    first = init_pki(tmp_path, devices=1)
    ca_before = first.layout.ca_cert.read_bytes()
    second = init_pki(tmp_path, devices=3)
    assert first.layout.ca_cert.read_bytes() == ca_before
    assert first.layout.ca_cert in second.kept and first.layout.device(1)[0] in second.kept
    assert first.layout.device(3)[0] in second.created
    third = init_pki(tmp_path, devices=3, coordinator_host="10.0.0.7")  # new host: server cert reissued
    assert first.layout.server_cert in third.created and "10.0.0.7" in san_hosts(load_certificate(first.layout.server_cert))
    forced = init_pki(tmp_path, devices=1, force=True)
    assert first.layout.ca_cert.read_bytes() != ca_before and first.layout.device(1)[0] in forced.created


def test_cli_command(tmp_path: Path) -> None:
    app = typer.Typer()
    certs_cmd.register(app)
    result = CliRunner().invoke(app, ["certs", "init", str(tmp_path / "pki"), "--devices", "2",
                                      "--coordinator-host", "fl.example.org"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "pki" / "devices" / "device-0002.key").exists()
    assert "fl.example.org" in san_hosts(load_certificate(tmp_path / "pki" / "coordinator.pem"))
    assert "created" in result.output and "FEDMASK_TLS__CLIENT_CA" in result.output


def test_issue_admin_gives_an_admin_role_certificate(tmp_path: Path) -> None:
    from coordinator.admin_auth import ADMIN_ROLE, certificate_roles

    app = typer.Typer()
    certs_cmd.register(app)
    result = CliRunner().invoke(app, ["certs", "issue-admin", str(tmp_path / "pki"), "ops"])
    flat = " ".join(result.output.replace("│", " ").split())  # rich boxes and wraps the message
    assert result.exit_code == 2 and "holds no CA" in flat  # needs `certs init` first
    assert CliRunner().invoke(app, ["certs", "init", str(tmp_path / "pki"), "--devices", "1"]).exit_code == 0
    result = CliRunner().invoke(app, ["certs", "issue-admin", str(tmp_path / "pki"), "ops"])
    assert result.exit_code == 0, result.output
    pki = PkiLayout(tmp_path / "pki")
    cert_path, key_path = pki.admin("ops")
    assert key_path.stat().st_mode & 0o777 == 0o600
    assert certificate_roles(cert_path.read_bytes()) == {ADMIN_ROLE}
    assert certificate_roles(pki.device(1)[0].read_bytes()) == frozenset()  # a device has no role
    assert load_certificate(cert_path).subject.rfc4514_string().startswith("CN=ops")
    bad = CliRunner().invoke(app, ["certs", "issue-admin", str(tmp_path / "pki"), "../evil"])
    assert bad.exit_code != 0


# -------------------------------------------------------------------- mTLS
def _mtls_server_credentials(pki: PkiLayout) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials(
        [(pki.server_key.read_bytes(), pki.server_cert.read_bytes())],
        root_certificates=pki.ca_cert.read_bytes(),
        require_client_auth=True,
    )


async def _health_check(port: int, credentials: grpc.ChannelCredentials, host_override: str | None = None) -> int:
    options = [("grpc.ssl_target_name_override", host_override)] if host_override else []
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials, options=options) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        return int(reply.status)


def test_mtls_accepts_a_device_certificate_and_rejects_others(pki: PkiLayout, tmp_path: Path) -> None:
    foreign = init_pki(tmp_path / "foreign", devices=1).layout

    async def scenario() -> None:
        server, port = await _serve(_mtls_server_credentials(pki))
        try:
            ca = pki.ca_cert.read_bytes()
            cert, key = pki.device(1)
            device = grpc.ssl_channel_credentials(ca, key.read_bytes(), cert.read_bytes())
            assert await _health_check(port, device) == health_pb2.HealthCheckResponse.SERVING
            # The server certificate also names the --coordinator-host.
            assert await _health_check(port, device, "coord.example") == health_pb2.HealthCheckResponse.SERVING
            # The servicer sees which device called.
            async with grpc.aio.secure_channel(f"127.0.0.1:{port}", device) as channel:
                reply = await coordinator_service_pb2_grpc.CoordinatorServiceStub(channel).Enroll(
                    enrollment_pb2.EnrollRequest(client_name="edge"), timeout=10
                )
            assert reply.coordinator_version == "device-0001"

            no_cert = grpc.ssl_channel_credentials(ca)
            fcert, fkey = foreign.device(1)
            wrong_ca = grpc.ssl_channel_credentials(ca, fkey.read_bytes(), fcert.read_bytes())
            for creds in (no_cert, wrong_ca):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await _health_check(port, creds)
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            await server.stop(None)

    asyncio.run(scenario())


def test_plaintext_client_cannot_reach_an_mtls_server(pki: PkiLayout) -> None:
    async def scenario() -> None:
        server, port = await _serve(_mtls_server_credentials(pki))
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            await server.stop(None)

    asyncio.run(scenario())


# ------------------------------------------------------------------- token
def test_token_interceptor_returns_unauthenticated() -> None:
    async def scenario() -> None:
        server, port = await _serve(None, [TokenAuthInterceptor(TOKEN)])
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = coordinator_service_pb2_grpc.CoordinatorServiceStub(channel)
                request = enrollment_pb2.EnrollRequest(client_name="edge")
                for metadata in ((), bearer_metadata("wrong-token-0123456789"), (("authorization", TOKEN),)):
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await stub.Enroll(request, metadata=metadata, timeout=10)
                    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
                    assert info.value.details() == UNAUTHENTICATED_DETAILS
                ok = await stub.Enroll(request, metadata=bearer_metadata(TOKEN), timeout=10)
                assert ok.protocol_version == "fedmask.v1" and ok.coordinator_version == "anonymous"

                # The bidirectional Session stream is refused the same way...
                call = stub.Session(timeout=10)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call.read()
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
                # ...and works with the token.
                call = stub.Session(metadata=bearer_metadata(TOKEN), timeout=10)
                await call.write(session_pb2.ClientMessage(heartbeat=session_pb2.Heartbeat(sequence=7)))
                echoed = await call.read()
                assert echoed.heartbeat.sequence == 7
                await call.done_writing()

                # Health probes need no token.
                health_reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
                assert health_reply.status == health_pb2.HealthCheckResponse.SERVING
        finally:
            await server.stop(None)

    asyncio.run(scenario())


def test_token_interceptor_can_guard_health_too() -> None:
    async def scenario() -> None:
        server, port = await _serve(None, [TokenAuthInterceptor(TOKEN, exempt_prefixes=())])
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        finally:
            await server.stop(None)

    asyncio.run(scenario())


def test_empty_token_is_refused() -> None:
    with pytest.raises(ValueError):
        TokenAuthInterceptor("")


def test_certificates_rotate_without_a_restart(tmp_path: Path) -> None:
    """The server re-reads tls.cert / tls.key / tls.client_ca when they
    change: after the files are replaced by another federation's PKI, new
    connections need the new CA and certificates; a half-written rotation
    (a certificate without its key) is not served."""
    import shutil

    from coordinator.server import server_credentials
    from coordinator.settings import CoordinatorSettings

    old = init_pki(tmp_path / "old", devices=1).layout
    new = init_pki(tmp_path / "new", devices=1).layout
    served = tmp_path / "served"
    served.mkdir()
    for name in ("ca.pem", "coordinator.pem", "coordinator.key"):
        shutil.copy(old.root / name, served / name)
    settings = CoordinatorSettings.load(overrides={
        "tls.cert": str(served / "coordinator.pem"), "tls.key": str(served / "coordinator.key"),
        "tls.client_ca": str(served / "ca.pem"), "tls.require_client_cert": True, "auth.mode": "mtls"})

    def device(pki: PkiLayout) -> grpc.ChannelCredentials:
        cert, key = pki.device(1)
        return grpc.ssl_channel_credentials(pki.ca_cert.read_bytes(), key.read_bytes(), cert.read_bytes())

    async def scenario() -> None:
        creds = server_credentials(settings)
        assert creds is not None
        server, port = await _serve(creds)
        try:
            assert await _health_check(port, device(old)) == health_pb2.HealthCheckResponse.SERVING
            shutil.copy(new.root / "coordinator.pem", served / "coordinator.pem")  # half-way: key not yet
            assert await _health_check(port, device(old)) == health_pb2.HealthCheckResponse.SERVING
            shutil.copy(new.root / "coordinator.key", served / "coordinator.key")
            shutil.copy(new.root / "ca.pem", served / "ca.pem")
            assert await _health_check(port, device(new)) == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await _health_check(port, device(old))
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            await server.stop(None)

    asyncio.run(scenario())
