"""The replica group of the coordinator's settings (`[replica]`,
FEDMASK_REPLICA__*, the "Replicas" flags): this process as one replica of
a coordinator tier (D90, D109), and why the active mode refuses the rest of
the settings (`active_replica_refusal`, applied by CoordinatorSettings)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from coordinator.store.url import serves_replicas
from fedmask_settings import SettingsGroup, host_port_check


class ReplicaSettings(SettingsGroup):
    """This process as one replica of a coordinator tier (D90)."""

    #: The replica's name in the leader lease and the logs (default:
    #: HOSTNAME-PID). Two live replicas must not share one.
    id: Annotated[str, Field(min_length=1, max_length=255)] | None = None
    #: Seconds a leader's lease lasts; it renews every third of it. A dead
    #: leader stops rounds for at most about this long.
    lease_s: Annotated[float, Field(ge=1.0, le=600.0)] = 10.0
    #: "standby" (default): one replica leads and serves devices, the others
    #: wait for its lease (D90, D94). "active": every replica is a member of
    #: the tier, holds device streams and runs the groups of its own
    #: devices, one of them leads and plans rounds across the replicas
    #: (D109). Active needs PostgreSQL, secure aggregation and no hybrid
    #: rounds (validated with the whole settings).
    mode: Literal["standby", "active"] = "standby"
    #: HOST:PORT at which the admin service reaches this replica's admin
    #: listener (written in its membership row): the top-k requests of the
    #: devices it holds go there (D111); None: not advertised.
    advertise_admin: Annotated[str, host_port_check("advertise address")] | None = None
    #: Active mode: seconds between a replica's reads of the rows it acts
    #: on (its assigned groups; the leader's group progress).
    poll_s: Annotated[float, Field(gt=0.0, le=60.0)] = 0.2
    #: Active mode: a replica publishes the devices it holds at most this
    #: often (one fenced transaction each time).
    publish_interval_s: Annotated[float, Field(gt=0.0, le=60.0)] = 0.25


def active_replica_refusal(*, database_url: str, plaintext: bool, hybrid: bool) -> str | None:
    """Why replica.mode "active" (D109) cannot run with these settings, or
    None: the store must serve several processes (PostgreSQL, D90), and
    every round runs in groups on the replicas, which the plaintext and
    the hybrid paths do not (`round_groups.groups_refusal`)."""
    if not serves_replicas(database_url):
        return ("replica.mode 'active' needs a store shared by the replicas: this store serves one coordinator "
                "process; run several replicas on PostgreSQL")
    why = "debug.insecure_plaintext" if plaintext else "hybrid.unprotected_plaintext_j_bound" if hybrid else None
    if why is None:
        return None
    return (f"replica.mode 'active' runs every round in groups on the replicas (D109), and rounds in groups do "
            f"not run with {why}: unset it or use replica.mode 'standby'")


__all__ = ["ReplicaSettings", "active_replica_refusal", "transaction_idle_limit"]


def transaction_idle_limit(lease_s: float) -> float:
    """Seconds a replica's PostgreSQL session may stay idle inside a
    transaction (coordinator/store/engine.py): half its lease, so that the
    row locks of a replica stopped mid-transaction are gone before another
    may take the lease it held."""
    return lease_s / 2.0
