"""HAProxy in front of coordinator replicas (D94): its configuration, and
HAProxy as a child process for the tests and the benchmarks.

The balancer passes TCP through (`mode tcp`): a device's gRPC stream is one
long HTTP/2 connection that must stay on one replica, and TLS (mTLS in the
deployment) ends at the coordinator, whose certificate the devices check.
HAProxy sends device traffic to the replicas whose health listener
(`--health-listen`, plaintext grpc.health.v1) says the coordinator service
is SERVING, the one with the fewest connections first (`balance
leastconn`: streams last for hours, so spreading new ones by what each
replica holds now beats taking turns). In the standby mode (D90) that is
the leader alone: a standby says NOT_SERVING. In the active mode (D109)
every live replica says SERVING and holds a share of the streams. A dead
replica does not answer. The admin route goes to the replica whose health
listener says the admin service (`CoordinatorAdmin`) is SERVING: the
leader alone, in either mode, since it carries out operator actions.
HAProxy 2.6 has no gRPC health check of its own, so the check is the gRPC
call spelled out in bytes
(`grpc_health_request`): the HTTP/2 preface, an empty SETTINGS frame, the
request's HEADERS (HPACK literals, no Huffman) and its DATA (the gRPC
message HealthCheckRequest{service}); the check passes when the answer
holds the gRPC message HealthCheckResponse{status: SERVING}
(`SERVING_REPLY`). A replica marked down has its connections cut
(`on-marked-down shutdown-sessions`), so the devices of a paused or deposed
leader reconnect through the balancer at once.

`haproxy_config` renders the configuration (deploy/haproxy/haproxy.cfg is
one rendering of it; a test keeps the two equal), `Balancer` runs Debian's
`haproxy` binary on it and reads its servers' states from the stats socket.
"""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fedmask_proto.v1 import admin_service_pb2, coordinator_service_pb2

#: The gRPC service a replica that serves devices reports SERVING on its health listener.
COORDINATOR_SERVICE = coordinator_service_pb2.DESCRIPTOR.services_by_name["CoordinatorService"].full_name
#: The gRPC service the leader alone reports SERVING there: it answers the admin listener's operator actions.
ADMIN_SERVICE = admin_service_pb2.DESCRIPTOR.services_by_name["CoordinatorAdmin"].full_name
#: The gRPC message a SERVING answer carries: not compressed, 2 bytes, field 1 (status) = 1 (SERVING).
SERVING_REPLY = bytes.fromhex("00" "00000002" "0801")
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _literal(name_index: int, value: bytes) -> bytes:
    """An HPACK literal header field without indexing, its name from the
    static table (index < 15), its value raw (length < 128)."""
    assert 0 < name_index < 15 and len(value) < 128
    return bytes([name_index, len(value)]) + value


def grpc_health_request(service: str = COORDINATOR_SERVICE, authority: str = "fedmask") -> bytes:
    """The bytes of one grpc.health.v1.Health/Check call for `service` over
    a fresh HTTP/2 connection (see the module doc)."""
    name = service.encode()
    assert len(name) < 128
    headers = (b"\x83\x86"  # :method POST, :scheme http (static table 3, 6)
               + _literal(4, b"/grpc.health.v1.Health/Check")  # :path
               + _literal(1, authority.encode())  # :authority
               + b"\x0f\x10" + bytes([16]) + b"application/grpc"  # content-type (static table 31)
               + b"\x00\x02te\x08trailers")
    message = b"\x0a" + bytes([len(name)]) + name  # HealthCheckRequest{service}
    data = b"\x00" + struct.pack(">I", len(message)) + message
    return (_PREFACE + _frame(4, 0, 0, b"")  # SETTINGS
            + _frame(1, 0x4, 1, headers)  # HEADERS, END_HEADERS
            + _frame(0, 0x1, 1, data))  # DATA, END_STREAM


@dataclass(frozen=True)
class Replica:
    """One coordinator replica behind the balancer: its name, its host, the
    port of its health listener, and its port for each route (by route name)."""

    name: str
    host: str
    health_port: int
    ports: Mapping[str, int]


@dataclass(frozen=True)
class Route:
    """A frontend: HAProxy listens on `bind` and forwards to the port of
    the same name (the device port, the admin port) of the replicas whose
    health listener reports `service` SERVING."""

    name: str
    bind: str
    service: str = COORDINATOR_SERVICE


#: The comment above each backend: which replicas report its route's service SERVING.
_WHO = {COORDINATOR_SERVICE: ["    # the replicas whose health listener says the coordinator service is SERVING: the leader",
                              "    # (replica.mode standby, D90), or every live replica (replica.mode active, D109)"],
        ADMIN_SERVICE: ["    # the replica whose health listener says the admin service is SERVING: the leader, which",
                        "    # carries out operator actions (in either replica mode)"]}


def haproxy_config(routes: Sequence[Route], replicas: Sequence[Replica], *, stats_socket: str | None = None,
                   resolvers: bool = False, check_interval_ms: int = 500,
                   extra_global: Sequence[str] = ()) -> str:
    """The HAProxy configuration: one TCP frontend and backend per route,
    every backend over all `replicas`, checked on their health listeners.
    `resolvers`: resolve the replicas' host names through /etc/resolv.conf
    at run time (containers come and go); `stats_socket`: a UNIX socket for
    `show stat`."""
    lines = ["# fedmask: HAProxy in front of the coordinator replicas (fedmask/bench/balancer.py, D94).",
             "global", *(f"    {g}" for g in extra_global)]  # maxconn: from the file-descriptor limit
    if stats_socket is not None:
        lines.append(f"    stats socket {stats_socket} mode 600 level admin")
    lines += ["", "defaults", "    mode tcp", "    timeout connect 2s",
              "    # device streams are long-lived; their heartbeats keep them busy",
              "    timeout client 10m", "    timeout server 10m", "    timeout check 1s",
              f"    default-server inter {check_interval_ms}ms rise 1 fall 2 on-marked-down shutdown-sessions"]
    if resolvers:
        lines += ["", "resolvers dns", "    parse-resolv-conf", "    hold valid 5s"]
    for route in routes:
        lines += ["", f"frontend {route.name}", f"    bind {route.bind}", f"    default_backend {route.name}-serving",
                  "", f"backend {route.name}-serving",
                  *_WHO[route.service],
                  "    balance leastconn", "    option tcp-check", "    tcp-check connect",
                  f"    tcp-check send-binary {grpc_health_request(route.service).hex()}",
                  f"    tcp-check expect binary {SERVING_REPLY.hex()}"]
        for r in replicas:
            dns = " resolvers dns init-addr libc,none" if resolvers else ""
            lines.append(f"    server {r.name} {r.host}:{r.ports[route.name]} check port {r.health_port}{dns}")
    return "\n".join(lines) + "\n"


#: deploy/compose.yaml's replicas: the device port, the admin listener and the health listener.
DEPLOYMENT_REPLICAS = tuple(Replica(f"coordinator-{i}", f"coordinator-{i}", 50052, {"devices": 50051, "admin": 50053})
                            for i in (1, 2, 3))
DEPLOYMENT_ROUTES = (Route("devices", "0.0.0.0:50051"), Route("admin", "0.0.0.0:50053", ADMIN_SERVICE))


def deployment_config() -> str:
    """deploy/haproxy/haproxy.cfg (`python -m fedmask.bench.balancer` prints it)."""
    return haproxy_config(DEPLOYMENT_ROUTES, DEPLOYMENT_REPLICAS, resolvers=True)


def haproxy_binary() -> str | None:
    """Debian's haproxy (.ci/ensure-haproxy installs it), or None."""
    found = shutil.which("haproxy")
    if found is None and Path("/usr/sbin/haproxy").exists():  # outside a non-root PATH
        found = "/usr/sbin/haproxy"
    return found


class Balancer:
    """`haproxy -db -f CONFIG` as a child process (its log in `log_path`);
    `servers()` reads each backend server's state from the stats socket."""

    def __init__(self, workdir: Path, routes: Sequence[Route], replicas: Sequence[Replica],
                 env: Mapping[str, str] | None = None) -> None:
        binary = haproxy_binary()
        if binary is None:
            raise FileNotFoundError("haproxy is not installed (Debian: apt-get install haproxy; .ci/ensure-haproxy)")
        self.socket = workdir / "haproxy.sock"
        self.config = workdir / "haproxy.cfg"
        self.config.write_text(haproxy_config(routes, replicas, stats_socket=str(self.socket)))
        self.log_path = workdir / "haproxy.log"
        check = subprocess.run([binary, "-c", "-q", "-f", str(self.config)], capture_output=True, text=True)
        if check.returncode != 0:
            raise ValueError(f"haproxy refuses the configuration: {check.stderr or check.stdout}")
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen([binary, "-db", "-f", str(self.config)], stdout=log,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=None if env is None else dict(env), start_new_session=True)
        try:  # a configuration that passes -c can still fail at start (limits, a port taken)
            self.popen.wait(0.5)
        except subprocess.TimeoutExpired:
            return
        raise RuntimeError(f"haproxy exited with code {self.popen.returncode}: {self.log_path.read_text()[-2000:]}")

    def servers(self) -> dict[str, str]:
        """"backend/server" -> its status (UP, DOWN, ...) from `show stat`;
        {} while the socket is not up."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(2.0)
                s.connect(str(self.socket))
                s.sendall(b"show stat\n")
                raw = b""
                while chunk := s.recv(65536):
                    raw += chunk
        except OSError:
            return {}
        out: dict[str, str] = {}
        rows = raw.decode(errors="replace").splitlines()
        header = rows[0].lstrip("# ").split(",") if rows else []
        for row in rows[1:]:
            fields = dict(zip(header, row.split(",")))
            if fields.get("svname") not in (None, "", "FRONTEND", "BACKEND"):
                out[f"{fields['pxname']}/{fields['svname']}"] = fields.get("status", "")
        return out

    def close(self) -> int:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
        return self.popen.wait(10)


__all__ = ["ADMIN_SERVICE", "COORDINATOR_SERVICE", "DEPLOYMENT_REPLICAS", "DEPLOYMENT_ROUTES", "SERVING_REPLY", "Balancer", "Replica",
           "Route", "deployment_config",
           "grpc_health_request", "haproxy_binary", "haproxy_config"]

if __name__ == "__main__":
    print(deployment_config(), end="")
