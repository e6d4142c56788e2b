"""Build and run the coordinator's grpc.aio server.

    server, port = await build_server(coordinator, settings, health)  # bound, not started
    await server.start(); ...; await server.stop(grace)

`serve(settings)` is what `fedmask coordinator` runs: open the store, build
the model, recover, serve CoordinatorService + grpc.health.v1 + reflection,
run rounds, and on SIGINT/SIGTERM shut down gracefully (ServerShutdown to
clients, the running round aborted with COORDINATOR_SHUTDOWN, the health
status NOT_SERVING, the store closed). With `admin.listen` it also serves
CoordinatorAdmin (+ health) on that second listener with the admin
credential (`build_admin_server`, coordinator/admin_auth.py, D40); with
`metrics.listen` the Prometheus endpoint (GET /metrics) on a third.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from coordinator.admin_auth import AdminListenerAuth, DeviceListenerGuard, admin_token_digests
from coordinator.admin_servicer import SERVICE_NAME as ADMIN_SERVICE_NAME
from coordinator.admin_servicer import AdminServicer, add_admin_to_server
from coordinator.auth import TokenAuthInterceptor, TokenFile
from coordinator.credential_watch import CredentialCheck, recheck_interval_s, token_file_interval_s
from coordinator.leadership import LeaseHeld, LeaseKeeper, default_replica_id
from coordinator.logs import log_event
from coordinator.metrics import CoordinatorMetrics
from coordinator.model_host import build_server_model
from coordinator.replica_settings import transaction_idle_limit
from coordinator.round_policy import dp_refusal, masked_length
from coordinator.servicer import add_to_server
from coordinator.service import Coordinator
from coordinator.settings import MIN_TOKEN_LENGTH, CoordinatorSettings
from coordinator.store import Store, StoreError, open_store
from coordinator.store.url import serves_replicas
from fedmask_proto.v1 import coordinator_service_pb2
from secagg.shamir import ELEMENT_BYTES
from wire.protocol import (
    COMPONENT_SHARE_WIRE_BYTES,
    ENCRYPTED_SHARE_WIRE_BYTES,
    MASKED_ELEMENT_BYTES,
    MASKED_INPUT_OVERHEAD_BYTES,
    UNMASKING_SHARE_WIRE_BYTES,
)

SERVICE_NAME = coordinator_service_pb2.DESCRIPTOR.services_by_name["CoordinatorService"].full_name


class CertificateFiles:
    """The server's TLS material, read from its files and re-read when one of
    them changes, so certificates rotate without a restart (D30): gRPC asks
    `fetch` on every new handshake; it returns a new configuration when a
    file's mtime or size changed and the certificate matches the key (a
    rotation written half-way is not served; the last good pair stays)."""

    def __init__(self, cert: Path, key: Path, client_ca: Path | None) -> None:
        self._paths = (cert, key, client_ca)
        self._stamp = self._stamp_now()
        config = self._read()
        if config is None:
            raise ValueError(f"tls.cert {cert} does not match tls.key {key}")
        self.initial = config

    def _stamp_now(self) -> tuple[tuple[int, int], ...]:
        out = []
        for p in self._paths:
            if p is not None:
                st = p.stat()
                out.append((st.st_mtime_ns, st.st_size))
        return tuple(out)

    def _read(self) -> grpc.ServerCertificateConfiguration | None:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        cert_path, key_path, ca_path = self._paths
        cert, key = cert_path.read_bytes(), key_path.read_bytes()
        try:
            public = x509.load_pem_x509_certificate(cert).public_key()
            private = serialization.load_pem_private_key(key, password=None)
        except ValueError:
            return None
        raw = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        if public.public_bytes(*raw) != private.public_key().public_bytes(*raw):
            return None
        root = ca_path.read_bytes() if ca_path is not None else None
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=root)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        try:
            stamp = self._stamp_now()
            if stamp == self._stamp:
                return None
            config = self._read()
        except OSError as e:
            log_event("tls_files_unreadable", logging.WARNING, why=e.strerror or str(e))
            return None
        if config is None:
            log_event("tls_rotation_skipped", logging.WARNING, why="the certificate does not match the key (yet)")
            return None
        self._stamp = stamp
        log_event("tls_rotated", cert=str(self._paths[0]))
        return config


def server_credentials(settings: CoordinatorSettings, *, admin: bool = False) -> grpc.ServerCredentials | None:
    """TLS credentials from tls.cert / tls.key (/ tls.client_ca), re-read
    when the files change (`CertificateFiles`); None without TLS. For the
    admin listener (`admin`), client certificates are required in
    admin.auth "mtls" and not asked for otherwise."""
    tls = settings.tls
    if tls.cert is None or tls.key is None:  # TLS off (the settings give both or neither)
        return None
    mtls = settings.admin.auth == "mtls" if admin else tls.require_client_cert
    files = CertificateFiles(tls.cert, tls.key, tls.client_ca if (mtls or not admin) else None)
    # gRPC's contract: the fetcher returns None when nothing changed (the
    # type stubs omit the None)
    fetch = cast(Callable[[], grpc.ServerCertificateConfiguration], files.fetch)
    return grpc.dynamic_ssl_server_credentials(files.initial, fetch, require_client_authentication=mtls)


def max_receive_message_bytes(settings: CoordinatorSettings, update_dim: int) -> int:
    """The gRPC receive limit: enough for one MaskedInput of `update_dim`
    elements, or a ShareKeys / UnmaskingResponse of the largest cohort (with
    removable noise's component shares when dp.dropouts is 'remove'), with
    25% + 64 KiB headroom; at least 4 MiB (gRPC's default). Sizes come from
    `wire.protocol`; `settings.max_receive_message_bytes` overrides."""
    if settings.max_receive_message_bytes is not None:
        return settings.max_receive_message_bytes
    n = settings.cohort.selected
    # removable noise (D110): at most n - t < n / 2 component seeds per device, one share each per peer
    m = n // 2 if settings.dp.dropouts == "remove" else 0
    masked = MASKED_ELEMENT_BYTES * update_dim + MASKED_INPUT_OVERHEAD_BYTES
    shares = n * (ENCRYPTED_SHARE_WIRE_BYTES + m * ELEMENT_BYTES)
    unmask = 2 * n * UNMASKING_SHARE_WIRE_BYTES + n * m * COMPONENT_SHARE_WIRE_BYTES
    need = max(masked, shares, unmask)
    return max(4 << 20, int(need * 1.25) + (64 << 10))


async def build_server(coordinator: Coordinator, settings: CoordinatorSettings,
                       health_servicer: health.aio.HealthServicer) -> tuple[grpc.aio.Server, int]:
    """A bound grpc.aio server (not started) answering grpc.health.v1 from
    `health_servicer`: (server, port)."""
    interceptors: list[grpc.aio.ServerInterceptor] = [
        DeviceListenerGuard(admin_token_digests(settings.admin) if settings.admin.listen is not None else None,
                            check_certificates=settings.tls.client_ca is not None),
    ]
    credential: CredentialCheck | None = None  # tokens that can be withdrawn while streams are open
    if settings.auth.mode == "token":
        token, token_file = settings.auth.token, settings.auth.token_file
        if token_file is not None:
            tokens = TokenAuthInterceptor(TokenFile(token_file, min_length=MIN_TOKEN_LENGTH,
                                                    interval_s=token_file_interval_s(settings.heartbeat_interval)))
            interceptors.append(tokens)
            credential = tokens.accepts
        elif token is not None:
            interceptors.append(TokenAuthInterceptor(token.get_secret_value()))
        else:  # the settings refuse mode "token" without one
            raise ValueError("auth.mode 'token' needs auth.token or auth.token_file")
    options = [
        ("grpc.max_receive_message_length",
         max_receive_message_bytes(settings, masked_length(settings, coordinator.model.update_dim))),
        ("grpc.max_send_message_length", -1),
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
    ]
    server = grpc.aio.server(interceptors=interceptors, options=options)
    add_to_server(coordinator, server, credential=credential)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server
    )
    creds = server_credentials(settings)
    address = settings.listen_address
    port = server.add_secure_port(address, creds) if creds is not None else server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    return server, port


async def build_admin_server(coordinator: Coordinator,
                             settings: CoordinatorSettings) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """The admin listener on admin.listen (bound, not started): CoordinatorAdmin,
    grpc.health.v1 and reflection, behind `AdminListenerAuth`."""
    admin = settings.admin
    assert admin.listen is not None
    heartbeat = settings.heartbeat_interval
    auth = AdminListenerAuth(admin.auth, admin_token_digests(admin, interval_s=token_file_interval_s(heartbeat)))
    server = grpc.aio.server(interceptors=[auth], options=[
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
    ])
    add_admin_to_server(AdminServicer(coordinator.actions, live=coordinator.live_state, events=coordinator.events,
                                      metrics=coordinator.metrics,
                                      credential=auth.accepts if admin.token_file is not None else None,
                                      recheck_s=recheck_interval_s(heartbeat)), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (ADMIN_SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server)
    creds = server_credentials(settings, admin=True)
    port = server.add_secure_port(admin.listen, creds) if creds is not None else server.add_insecure_port(admin.listen)
    if port == 0:
        raise OSError(f"cannot listen on {admin.listen}")
    return server, port, health_servicer


def start_metrics_server(metrics: CoordinatorMetrics, address: str) -> tuple[Any, int]:
    """Serve GET /metrics of `metrics` (a coordinator's, labelled with its
    replica) on `address` (a daemon thread); returns (the HTTP server, its port)."""
    from prometheus_client import start_http_server

    from coordinator.settings import split_host_port

    host, port = split_host_port(address)
    httpd, _thread = start_http_server(port, addr=host, registry=metrics.exposed)
    return httpd, int(httpd.server_address[1])


async def build_health_server(health_servicer: health.aio.HealthServicer, address: str) -> grpc.aio.Server:
    """A bound plaintext server (not started) with grpc.health.v1 alone,
    sharing `health_servicer` (so the same status) with the main server."""
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if server.add_insecure_port(address) == 0:
        raise OSError(f"cannot listen on {address} (health_listen_address)")
    return server


async def open_store_waiting(url: str, wait_s: float, *, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                             clock: Callable[[], float] = time.monotonic,
                             idle_in_transaction_s: float | None = None) -> Store:
    """`open_store(url, idle_in_transaction_s=...)`, retried with exponential backoff (0.5 s doubling to
    5 s) for up to `wait_s` seconds while a database *server* cannot be
    reached (an OperationalError: refused, not up yet, starting). Anything
    else, a SQLite file, memory:// or `wait_s` spent raises at once."""
    from sqlalchemy.exc import OperationalError

    retry = wait_s > 0 and not url.startswith(("sqlite", "memory"))
    deadline = clock() + wait_s
    delay = 0.5
    while True:
        try:
            return open_store(url, idle_in_transaction_s=idle_in_transaction_s)
        except StoreError as exc:
            left = deadline - clock()
            if not (retry and isinstance(exc.__cause__, OperationalError) and left > 0):
                raise
            pause = min(delay, left)
            log_event("database_unavailable", logging.WARNING, retry_in_s=round(pause, 2),
                      gives_up_in_s=round(left, 1), error=str(exc.__cause__).splitlines()[0][:200])
            await sleep(pause)
            delay = min(delay * 2, 5.0)


async def set_serving(health_servicer: health.aio.HealthServicer, serving: bool, name: str = SERVICE_NAME) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for service in ("", name):
        await health_servicer.set(service, status)


async def set_leading(health_servicer: health.aio.HealthServicer, leading: bool) -> None:
    """The admin service's status on the health listener: SERVING on the
    leader alone, so a balancer sends operator actions there (D94, D109);
    the other services' statuses are left as they are."""
    status = health_pb2.HealthCheckResponse.SERVING if leading else health_pb2.HealthCheckResponse.NOT_SERVING
    await health_servicer.set(ADMIN_SERVICE_NAME, status)


async def start_admin(coordinator: Coordinator, settings: CoordinatorSettings) -> grpc.aio.Server | None:
    """The admin listener, started (None when `admin.listen` is unset)."""
    if settings.admin.listen is None:
        return None
    admin_server, admin_port, admin_health = await build_admin_server(coordinator, settings)
    await admin_server.start()
    await set_serving(admin_health, True, ADMIN_SERVICE_NAME)
    coordinator.ports["admin"] = admin_port
    log_event("admin_listening", address=settings.admin.listen, port=admin_port, auth=settings.admin.auth,
              tls=settings.tls.enabled)
    return admin_server


async def start_health_listener(health_servicer: health.aio.HealthServicer, address: str) -> grpc.aio.Server:
    """The health listener, started: the process SERVING (alive), the
    coordinator and admin services NOT_SERVING until it serves devices and
    leads."""
    health_server = await build_health_server(health_servicer, address)
    await health_server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    await health_servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)
    await set_leading(health_servicer, False)
    return health_server


def warn_token_in_clear(settings: CoordinatorSettings) -> None:
    """Log a warning when the bearer token crosses the network in clear."""
    if settings.token_in_clear:
        log_event("insecure_token_transport", logging.WARNING, address=settings.listen_address,
                  why="auth.allow_insecure_token: the bearer token crosses the network in clear (no TLS)")


def handle_stop_signals(loop: asyncio.AbstractEventLoop, stop: asyncio.Event | None) -> None:
    """SIGINT and SIGTERM set `stop`; None: they are left to Python again."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            if stop is not None:
                loop.add_signal_handler(sig, stop.set)
            else:
                loop.remove_signal_handler(sig)


async def close_listeners(*servers: grpc.aio.Server | None, httpd: Any = None) -> None:
    """Stop at once the gRPC servers still listening, and the metrics server."""
    for server in servers:
        if server is not None:
            await server.stop(0)
    if httpd is not None:
        httpd.shutdown()
        httpd.server_close()


#: Exit status of a leader that lost its lease (a supervisor restarts it as a standby).
EXIT_DEPOSED = 3


def exit_if_stuck(after_s: float, *, exit: Callable[[int], object] = os._exit) -> threading.Timer:
    """A deposed leader's shutdown can hang: a database call in flight on a
    silent network (packets dropped, nothing reset) waits for the operating
    system's TCP timeouts, minutes. It holds nothing worth waiting for (the
    store's fence refuses its writes, D90), so after `after_s` the process
    ends with EXIT_DEPOSED anyway. The timer is a daemon: a shutdown that
    ends first ends it too."""
    def fire() -> None:
        log_event("deposed_exit_forced", logging.ERROR, after_s=after_s,
                  why="the deposed leader's shutdown did not end (a store call on a silent network)")
        exit(EXIT_DEPOSED)

    timer = threading.Timer(after_s, fire)
    timer.daemon = True
    timer.start()
    return timer


async def lead(keeper: LeaseKeeper, database_url: str) -> bool:
    """Take the leader lease (D90). On PostgreSQL a replica waits as a
    standby until it leads; a store that serves one coordinator (SQLite)
    waits at most 1.5 leases (a restarted coordinator outlives its
    predecessor's lease) and then refuses: False, with the reason logged."""
    try:
        await keeper.acquire(wait_s=None if serves_replicas(database_url) else 1.5 * keeper.lease_s)
    except LeaseHeld as exc:
        log_event("refused", logging.ERROR, why=f"{exc}: this store serves one coordinator process; run "
                  "several replicas on PostgreSQL (D90)")
        return False
    return True


def check_dp(settings: CoordinatorSettings, update_dim: int) -> None:
    """Refuse DP settings that cannot run the model's rounds (ValueError,
    naming what to change: a field too small for the cohort and its noise,
    D88), and warn that the float Gaussian's epsilon is approximate."""
    why = dp_refusal(settings, update_dim)
    if why is not None:
        raise ValueError(why)
    if settings.dp.mode != "none" and settings.dp.mechanism == "gaussian-float":
        log_event("dp_epsilon_approximate", logging.WARNING, mechanism="gaussian-float",
                  why="float Gaussian noise, rounded and clipped per coordinate by the fixed-point encoding: the "
                      "ledger's epsilon prices the Gaussian mechanism, not this one; use dp.mechanism "
                      "discrete-gaussian for an epsilon that holds (D88)")


async def serve(settings: CoordinatorSettings, *, store: Store | None = None, ready: asyncio.Event | None = None,
                stop: asyncio.Event | None = None, grace: float = 5.0,
                on_ready: Callable[[Coordinator, int], None] | None = None,
                deposed_exit_s: float | None = None) -> int:
    """Run the coordinator until `settings.rounds` are done or a signal
    (or `stop`) arrives. Returns the exit code. Once serving, `on_ready` gets
    the Coordinator and the bound port (in-process callers of its API, such
    as `request_top_k`, and tests; the admin and metrics ports are in
    `coordinator.ports`), then `ready` is set. `deposed_exit_s` (the
    command sets it; in-process callers leave it None): a deposed leader
    whose shutdown has not ended that many seconds after it lost the lease
    ends the process with EXIT_DEPOSED (`exit_if_stuck`)."""
    if settings.replica.mode == "active":  # another process shape (coordinator/active_serve.py)
        log_event("refused", logging.ERROR, why="replica.mode 'active' (D109) runs with "
                  "coordinator.active_serve.serve_active, not serve")
        return 2
    model = build_server_model(settings.model.name, settings.model.hyperparameters)
    check_dp(settings, model.update_dim)
    own_store = store is None
    store = store if store is not None else await open_store_waiting(
        settings.database_url, settings.database_wait_s,
        idle_in_transaction_s=transaction_idle_limit(settings.replica.lease_s))
    keeper = LeaseKeeper(store, settings.replica.id or default_replica_id(), settings.replica.lease_s)
    server = admin_server = httpd = None
    health_server = None
    lost = asyncio.Event()
    lost_reason: list[str] = []
    halt_keeper: Callable[[], None] | None = None
    health_servicer = health.aio.HealthServicer()
    metrics = CoordinatorMetrics(replica=keeper.holder)  # served by a standby too: fedmask_replica_leader 0
    try:
        if settings.metrics.listen is not None:
            httpd, metrics_port = start_metrics_server(metrics, settings.metrics.listen)
            log_event("metrics_listening", address=settings.metrics.listen, port=metrics_port)
        if settings.health_listen_address is not None:  # up at once: a standby is alive, not serving devices
            health_server = await start_health_listener(health_servicer, settings.health_listen_address)
        if not await lead(keeper, settings.database_url):
            return 2
        loop = asyncio.get_running_loop()

        def on_lost(reason: str) -> None:  # on the keeper's thread
            lost_reason.append(reason)
            loop.call_soon_threadsafe(lost.set)

        halt_keeper = keeper.keep_in_background(on_lost)  # renewing from now on, whatever start-up costs
        store.fence_writes(keeper.fence)
        metrics.leading(keeper.fence().token)
        coordinator = Coordinator(settings, store=store, model=model, metrics=metrics)
        await coordinator.start()
        server, port = await build_server(coordinator, settings, health_servicer)
        await server.start()
        await set_serving(health_servicer, True)
        await set_leading(health_servicer, True)
        coordinator.ports["device"] = port
        log_event("listening", address=settings.listen_address, port=port, model=model.name,
                  update_dim=model.update_dim, auth=settings.auth.mode, tls=settings.tls.enabled)
        admin_server = await start_admin(coordinator, settings)
        if httpd is not None:
            coordinator.ports["metrics"] = int(httpd.server_address[1])
        warn_token_in_clear(settings)
        stop = stop or asyncio.Event()
        handle_stop_signals(loop, stop)
        if on_ready is not None:
            on_ready(coordinator, port)
        if ready is not None:
            ready.set()
        rounds = asyncio.create_task(coordinator.run(), name="fedmask-rounds")
        stopper = asyncio.create_task(stop.wait())
        deposed = asyncio.create_task(lost.wait())
        await asyncio.wait({rounds, stopper, deposed}, return_when=asyncio.FIRST_COMPLETED)
        await set_leading(health_servicer, False)
        await set_serving(health_servicer, False)
        metrics.leading(None)
        if lost.is_set():  # deposed: stop leading at once; the store's fence refuses what is in flight
            log_event("leadership_lost", logging.ERROR, replica=keeper.holder, reason=lost_reason[0])
            if deposed_exit_s is not None:
                exit_if_stuck(deposed_exit_s)
        deposed.cancel()
        await coordinator.shutdown("coordinator shutting down" if stop.is_set() or lost.is_set()
                                   else "configured rounds done")
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(rounds, timeout=grace + 30)
        stopper.cancel()
        if admin_server is not None:
            await admin_server.stop(1.0)
        await server.stop(grace)
        handle_stop_signals(loop, None)
        return EXIT_DEPOSED if lost.is_set() else 0
    finally:
        if halt_keeper is not None:
            await asyncio.to_thread(halt_keeper)
            if not lost.is_set():
                await keeper.release()
        await close_listeners(server, admin_server, health_server, httpd=httpd)
        if own_store:
            store.close()
        log_event("stopped")
