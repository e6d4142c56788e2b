"""`fedmask coordinator --replica-mode active`: one replica of an active
tier (D109) as a process. Every replica serves device streams; the one
that holds the leader lease also plans the rounds.

`serve_active(settings)` opens the store, starts the `Coordinator` without
taking anything over (`start(lead=False)`: no recovery, no model written),
binds its device listener, joins the tier (`ActiveReplica`), and then
reports SERVING on its health listener at once, whether it leads or not: a
load balancer sends devices to every replica that says SERVING.

Contract:
- Leading is a term of the `ActiveReplica`'s election. At the start of
  each term the host's `Coordinator.take_over()` runs, fenced by that
  term's lease (recovery of the rounds a dead leader left, charged as D94
  says; the pause; the latest model version, or the first one on an empty
  store; the budget), and `fedmask_replica_leader` says 1 and the health
  listener reports the admin service SERVING (a balancer sends operator
  actions to the leader) until the term ends. Every leader-only write of the store (`commit_round`,
  `abort_round`, `mark_interrupted_rounds_aborted`, `add_model_version`)
  is fenced by the leader lease (`store.fence_writes`): from a replica
  that does not lead, it is refused with `FencedOut` and writes nothing.
- Losing the membership (its row taken over or expired: a replica cut off
  from the store, or paused past `replica.lease_s`) turns the health
  listener NOT_SERVING, stops the replica and ends the process with
  EXIT_DEPOSED (3), as D90 does for a deposed standby-mode leader; with
  `deposed_exit_s`, a shutdown that hangs is cut short (`exit_if_stuck`).
  A supervisor restarts it, and it joins again under a new term.
- A replica whose name a live term still holds (a crashed predecessor)
  waits 1.5 leases to join and then refuses: exit code 2.
- `settings.rounds` bounds the rounds of each leader term; the process
  serves until a signal or `stop`, or until its membership is lost.
Returns the exit code: 0 on a signal or `stop`, 2 when refused, 3 when
the membership was lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from grpc_health.v1 import health

from coordinator.leadership import LeaseHeld, default_replica_id
from coordinator.logs import log_event
from coordinator.metrics import CoordinatorMetrics
from coordinator.model_host import build_server_model
from coordinator.replica_server import ActiveReplica
from coordinator.server import (
    EXIT_DEPOSED,
    build_server,
    check_dp,
    close_listeners,
    exit_if_stuck,
    handle_stop_signals,
    open_store_waiting,
    set_leading,
    set_serving,
    start_admin,
    start_health_listener,
    start_metrics_server,
    warn_token_in_clear,
)
from coordinator.service import Coordinator
from coordinator.replica_settings import transaction_idle_limit
from coordinator.settings import CoordinatorSettings
from coordinator.store import Lease, Store
from fedmask_settings import split_host_port


async def serve_active(settings: CoordinatorSettings, *, store: Store | None = None,
                       ready: asyncio.Event | None = None, stop: asyncio.Event | None = None, grace: float = 5.0,
                       on_ready: Callable[[Coordinator, int], None] | None = None,
                       deposed_exit_s: float | None = None) -> int:
    """See the module doc. `on_ready` gets the Coordinator and the bound
    device port once the replica serves, then `ready` is set (as
    `server.serve`)."""
    model = build_server_model(settings.model.name, settings.model.hyperparameters)
    check_dp(settings, model.update_dim)
    own_store = store is None
    store = store if store is not None else await open_store_waiting(
        settings.database_url, settings.database_wait_s,
        idle_in_transaction_s=transaction_idle_limit(settings.replica.lease_s))
    name = settings.replica.id or default_replica_id()
    metrics = CoordinatorMetrics(replica=name)
    health_servicer = health.aio.HealthServicer()
    server = admin_server = httpd = health_server = None
    replica: ActiveReplica | None = None
    lost = asyncio.Event()
    reasons: list[str] = []
    background: set[asyncio.Future[None]] = set()  # status updates scheduled from callbacks
    try:
        if settings.metrics.listen is not None:
            httpd, metrics_port = start_metrics_server(metrics, settings.metrics.listen)
            log_event("metrics_listening", address=settings.metrics.listen, port=metrics_port)
        if settings.health_listen_address is not None:
            health_server = await start_health_listener(health_servicer, settings.health_listen_address)
        await set_leading(health_servicer, False)  # NOT_SERVING, not unknown, until this replica leads
        coordinator = Coordinator(settings, store=store, model=model, metrics=metrics)

        def membership_lost(reason: str) -> None:  # on the event loop, once
            reasons.append(reason)
            lost.set()

        async def take_over(lease: Lease) -> None:
            await coordinator.take_over()
            metrics.leading(lease.token)
            await set_leading(health_servicer, True)  # operator actions come here now

        def deposed() -> None:  # on the event loop
            metrics.leading(None)
            task = asyncio.ensure_future(set_leading(health_servicer, False))
            background.add(task)
            task.add_done_callback(background.discard)

        server, port = await build_server(coordinator, settings, health_servicer)
        host, _ = split_host_port(settings.listen_address)
        replica = ActiveReplica(settings, store, coordinator, replica=name, device_address=f"{host}:{port}",
                                on_membership_lost=membership_lost, recover=take_over,
                                on_depose=deposed)
        store.fence_writes(replica.leader_fence)
        await coordinator.start(lead=False)
        try:
            await replica.start()
        except LeaseHeld as exc:
            replica = None
            log_event("refused", logging.ERROR, why=f"{exc}: another process holds this replica's name in the tier; "
                      "give every replica its own replica.id")
            return 2
        await server.start()
        await set_serving(health_servicer, True)
        coordinator.ports["device"] = port
        log_event("listening", address=settings.listen_address, port=port, model=model.name, replica=name,
                  mode="active", update_dim=model.update_dim, auth=settings.auth.mode, tls=settings.tls.enabled)
        admin_server = await start_admin(coordinator, settings)
        if httpd is not None:
            coordinator.ports["metrics"] = int(httpd.server_address[1])
        warn_token_in_clear(settings)
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        handle_stop_signals(loop, stop)
        if on_ready is not None:
            on_ready(coordinator, port)
        if ready is not None:
            ready.set()
        waits = {asyncio.create_task(stop.wait()), asyncio.create_task(lost.wait())}
        _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        await set_leading(health_servicer, False)
        await set_serving(health_servicer, False)
        if lost.is_set():
            log_event("membership_lost_exit", logging.ERROR, replica=name, reason=reasons[0])
            if deposed_exit_s is not None:
                exit_if_stuck(deposed_exit_s)
        await replica.stop()
        replica = None
        await coordinator.shutdown("replica shutting down" if stop.is_set() else "replica left the tier")
        if admin_server is not None:
            await admin_server.stop(1.0)
        await server.stop(grace)
        handle_stop_signals(loop, None)
        return EXIT_DEPOSED if lost.is_set() else 0
    finally:
        if replica is not None:  # an error after joining: leave the tier, so its streams are dropped at once
            with contextlib.suppress(Exception):
                await replica.stop()
        await close_listeners(server, admin_server, health_server, httpd=httpd)
        if own_store:
            store.close()
        log_event("stopped")


__all__ = ["serve_active"]
