"""The federation's summary and its rounds: history from the coordinator's
store, the running round live from its admin listener (viewer)."""

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query

from admin import history, live_views, schemas
from admin.deps import LISTING_ERRORS, LIVE_ERRORS, STORE_ERRORS, Reader, ServicesDep, cursor_q, page_size
from admin.live import LiveError
from admin.problems import ProblemError, problem_responses
from admin.settings import AdminSettings
from coordinator.store import DeviceStatus
from dpmech import PROTECTS
from fedmask_proto.v1 import admin_service_pb2 as pb


async def federation(_: Reader, services: ServicesDep) -> schemas.Federation:
    """The model, its current version, rounds by outcome, devices, and the live phase; with an active
    tier of replicas, each replica's streams and which leads (from the store: the devices are counted
    over every replica, not only the leader's)."""
    def read() -> tuple[dict[schemas.Outcome, int], Any, int, int, list[schemas.ReplicaView] | None]:
        store = services.store
        latest = store.list_model_versions(limit=1).items
        devices = store.count_devices()  # counted in the store: no row of a large registry is read
        revoked = devices.get(DeviceStatus.REVOKED, 0)
        lease = store.current_lease()
        replicas = live_views.replica_views(store.stream_counts(), lease.holder if lease is not None else None)
        return services.rounds.counts(store), latest[0] if latest else None, sum(devices.values()), revoked, replicas

    counts, latest, enrolled, revoked, replicas = await services.read(read)
    entries = await services.read(services.store.privacy_ledger)
    claim = await services.read(lambda: history.privacy_claim(services.store, entries))
    state: pb.LiveState | None
    try:
        state = await services.live_state.get()
    except LiveError:
        state = None
    return schemas.Federation(
        model_name=latest.model_name if latest is not None else None,
        current_version=state.model_version if state is not None else (latest.id if latest else None),
        rounds_committed=counts["committed"], rounds_aborted=counts["aborted"], rounds_running=counts["running"],
        devices_enrolled=enrolled, devices_revoked=revoked,
        devices_connected=(sum(r.connected for r in replicas) if replicas is not None
                           else state.devices.connected if state is not None else None),
        replicas=replicas,
        phase=live_views.phase(state) if state is not None else None, coordinator_reachable=state is not None,
        epsilon_spent=entries[-1].cumulative_epsilon if entries else 0.0,
        epsilon_budget=(state.privacy.epsilon_budget or None) if state is not None else None,
        delta=claim.delta, protects=PROTECTS, privacy_statement=claim.statement, production_plan=claim.production_plan)


async def round_current(_: Reader, services: ServicesDep) -> schemas.CurrentRound:
    """The running round from the coordinator: stage, survivors per stage against the threshold."""
    return live_views.current_round(await services.live_call(services.live_state.get(), what="live state"))


async def round_detail(_: Reader, services: ServicesDep,
                       number: Annotated[int, Path(ge=1, le=2**62)]) -> schemas.RoundDetail:
    """One round: cohort, threshold, survivors and dropouts per stage, time per stage, outcome, metrics, epsilon."""
    found = await services.read(lambda: history.get_round(services.store, number))
    if found is None:
        raise ProblemError(404, f"no round {number}")
    return found


def router(settings: AdminSettings) -> APIRouter:
    """The routes, `/v1/rounds`'s `limit` bounded by `settings.max_page_size`."""
    limit_q = page_size(settings)

    outcome_q = Query(description="Only rounds of this outcome")

    async def rounds(_: Reader, services: ServicesDep, limit: Annotated[int | None, limit_q] = None,
                     cursor: Annotated[str | None, cursor_q("rounds")] = None,
                     outcome: Annotated[schemas.Outcome | None, outcome_q] = None) -> schemas.RoundPage:
        """Rounds, newest first. A filtered page may hold fewer than `limit` rounds and still have a cursor."""
        return await services.read_page(
            lambda n, c: history.list_rounds(services.store, limit=n, cursor=c, outcome=outcome), limit, cursor)

    routes = APIRouter()
    routes.add_api_route("/v1/federation", federation, response_model=schemas.Federation, tags=["federation"],
                         responses=STORE_ERRORS)
    routes.add_api_route("/v1/rounds", rounds, response_model=schemas.RoundPage, tags=["rounds"],
                         responses=LISTING_ERRORS)
    routes.add_api_route("/v1/rounds/current", round_current, response_model=schemas.CurrentRound, tags=["rounds"],
                         responses=LIVE_ERRORS)
    routes.add_api_route("/v1/rounds/{number}", round_detail, response_model=schemas.RoundDetail, tags=["rounds"],
                         responses=problem_responses(401, 403, 404, 422, 503))
    return routes
