"""HAProxy in front of the coordinator replicas (fedmask/bench/balancer.py,
D94): deploy/haproxy/haproxy.cfg is the rendering the code makes, HAProxy
accepts it, and the health check's bytes are a real gRPC health call that
tells the leader (SERVING) from a standby (NOT_SERVING)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fedmask.bench.balancer import (
    COORDINATOR_SERVICE,
    DEPLOYMENT_REPLICAS,
    SERVING_REPLY,
    deployment_config,
    grpc_health_request,
    haproxy_binary,
)

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "haproxy" / "haproxy.cfg"


def test_the_deployed_configuration_is_the_rendered_one() -> None:
    assert CONFIG.read_text() == deployment_config(), "regenerate: python -m fedmask.bench.balancer > " + str(CONFIG)


@pytest.mark.skipif(haproxy_binary() is None, reason="haproxy is not installed (Debian's haproxy; .ci/ensure-haproxy)")
def test_haproxy_accepts_the_configuration() -> None:
    done = subprocess.run([str(haproxy_binary()), "-c", "-f", str(CONFIG)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def _answer(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(grpc_health_request())
        got = b""
        while SERVING_REPLY not in got and b"\x00\x00\x00\x00\x02\x08\x02" not in got:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
        return got


def test_the_health_check_bytes_tell_the_leader_from_a_standby() -> None:
    async def main() -> list[bytes]:
        server = grpc.aio.server()
        servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        answers = []
        try:
            for status in (health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING):
                await servicer.set(COORDINATOR_SERVICE, status)
                answers.append(await asyncio.to_thread(_answer, port))
        finally:
            await server.stop(0)
        return answers

    serving, standby = asyncio.run(main())
    assert SERVING_REPLY in serving
    assert SERVING_REPLY not in standby and b"\x00\x00\x00\x00\x02\x08\x02" in standby  # NOT_SERVING


def test_compose_routes_the_devices_and_the_admin_service_through_the_balancer() -> None:
    import yaml

    compose = yaml.safe_load((CONFIG.parents[1] / "compose.yaml").read_text())
    services = compose["services"]
    balancer = services["balancer"]
    assert balancer["networks"]["fedmask"]["aliases"] == ["coordinator"]  # the name clients and admin dial
    assert "./haproxy/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro" in balancer["volumes"]
    replicas = sorted(name for name in services if name.startswith("coordinator-"))
    assert replicas == sorted(r.name for r in DEPLOYMENT_REPLICAS)
    for name in replicas:
        service = services[name]
        assert service["networks"] == ["fedmask"], f"{name} must not answer to 'coordinator' itself"
        env = service["environment"]
        assert env["FEDMASK_HEALTH_LISTEN_ADDRESS"] == "0.0.0.0:50052"  # reachable by the balancer's checks
        assert env["FEDMASK_LISTEN_ADDRESS"].endswith(":50051") and env["FEDMASK_ADMIN__LISTEN"].endswith(":50053")
    assert services["client-0"]["environment"]["FEDMASK_COORDINATOR"] == "coordinator:50051"
    assert services["admin"]["environment"]["FEDMASK_ADMIN_COORDINATOR__ADDRESS"] == "coordinator:50053"
