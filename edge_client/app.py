"""The edge-client process: hosts many devices, enrols them, keeps one session open.

    EdgeClient(ClientConfig(...)).prepare()   parse users, open the state dir,
                                              load the dataset and the local splits,
                                              identity keys, decline unfinished rounds
    await client.run()                        enrol (retrying), then sessions
                                              with backoff until stopped

`run_client(config)` does both and returns the process exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edge_client.backoff import Backoff, retry_pushback_s
from edge_client.cohort_floor import CohortFloor
from edge_client.contributions import ContributionRule
from edge_client.dp_floor import DpFloor
from edge_client.faults import FaultPlan
from edge_client.devices import Device, local_id_of
from edge_client.local_data import DatasetError, LocalData, load_interactions
from edge_client.round_run import RoundEvent
from edge_client.secure_update import decline_unfinished_rounds, own_certificate_refusal, write_certificate_request
from edge_client.session import FatalSessionError, SessionDriver
from edge_client.state import ClientStore, StateError
from edge_client.recommend_policy import RecommendationPolicy
from edge_client.platform_trainer import PlatformHosting, PlatformTrainer, platform_local_id
from edge_client.trainer import Trainer, TrainingError
from edge_client.transport import (
    FATAL_CODES,
    TransportConfig,
    TransportConfigError,
    describe_rpc_error,
    enroll,
    make_channel,
    run_session,
)
from edge_client.users import UserRangeError, check_users_fit, format_user_ranges, parse_user_ranges
from fedmask_proto.v1 import coordinator_service_pb2_grpc, session_pb2
from wire.protocol import is_loopback_target

log = logging.getLogger("edge_client")

CLIENT_VERSION = "0.1.0"
#: The GIL switch interval of `fedmask client` (run_client; D76).
GIL_SWITCH_INTERVAL_S = 0.001


class ClientError(Exception):
    """A problem the user must fix; the message says what (exit code 2)."""


@dataclass(frozen=True)
class ClientConfig:
    coordinator: str
    users: str
    state_dir: Path
    dataset: str = "ml-100k"
    data_dir: str | None = None
    device: str = "cpu"
    seed: int = 0
    name: str | None = None
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_server_name: str | None = None
    token: str | None = None
    faults: FaultPlan = field(default_factory=FaultPlan)
    exit_after_rounds: int | None = None
    backoff_base: float = 0.5
    backoff_cap: float = 30.0
    threads: int | None = None
    #: DEBUG ONLY (loopback coordinators): write each device's encoded input
    #: of every round to STATE_DIR/debug/inputs/ (tests, benchmarks).
    debug_record_inputs: bool = False
    #: INSECURE (loopback coordinators, benchmarks): answer the coordinator's
    #: plaintext rounds by sending unmasked updates.
    allow_insecure_plaintext: bool = False
    #: The smallest cohort and threshold this client's devices join.
    cohort_floor: CohortFloor = field(default_factory=CohortFloor)
    #: The least DP (mechanism, noise multiplier, clip) the devices train under (D85).
    dp_floor: DpFloor = field(default_factory=DpFloor)
    #: One contribution per (model, task) and so many per hour (D85).
    contribution_rule: ContributionRule = field(default_factory=ContributionRule)
    #: What the devices disclose for a top-k request (D84): whether they serve
    #: one at all, their cap on k, whether a request may ask for seen items.
    recommendations: RecommendationPolicy = field(default_factory=RecommendationPolicy)
    #: The federation's device CA certificate (PEM), kept apart from the
    #: coordinator (D33): devices join only active-mode rounds, and only with
    #: peers whose identity certificates it issued.
    device_ca: Path | None = None
    #: UNPROTECTED updates (FedMMF hybrid rounds, D64): a device whose J is at
    #: most this (and the round's bound) sends its update in plaintext. Needs
    #: TLS to the coordinator. None: never.
    unprotected_plaintext_j_bound: float | None = None
    #: Cross-silo FREIB (D68): host one whole platform as one device instead of `users`.
    platform: PlatformHosting | None = None


class EdgeClient:
    def __init__(self, config: ClientConfig, *, backoff: Backoff | None = None) -> None:
        self.config = config
        self.backoff = backoff or Backoff(base=config.backoff_base, cap=config.backoff_cap)
        self.store: ClientStore | None = None
        self.trainer: Trainer | None = None
        self.hosted: list[Device] = []
        self.driver: SessionDriver | None = None
        self.rounds_done = 0
        self.events: list[RoundEvent] = []
        self._stop: asyncio.Event | None = None  # created in run()
        self.name = config.name or f"edge-{socket.gethostname()}-{os.getpid()}"
        self.device_ca: x509.Certificate | None = None

    # ------------------------------------------------------------ set-up
    def prepare(self) -> EdgeClient:
        cfg = self.config
        try:
            self.transport = TransportConfig(
                target=cfg.coordinator, tls_ca=cfg.tls_ca, tls_cert=cfg.tls_cert, tls_key=cfg.tls_key,
                tls_server_name=cfg.tls_server_name, token=cfg.token,
            )
            numbers = [cfg.platform.platform] if cfg.platform is not None else parse_user_ranges(cfg.users)
        except (TransportConfigError, UserRangeError) as e:
            raise ClientError(str(e)) from None
        if (cfg.debug_record_inputs or cfg.allow_insecure_plaintext) and not all(
                is_loopback_target(t) for t in self.transport.targets):
            raise ClientError("--debug-record-inputs and --debug-allow-insecure-plaintext are for tests and "
                              "benchmarks against a loopback coordinator only")
        if cfg.unprotected_plaintext_j_bound is not None:
            b = cfg.unprotected_plaintext_j_bound
            if not (math.isfinite(b) and b >= 0):
                raise ClientError(f"--unprotected-plaintext-j-bound must be a finite number >= 0, got {b}")
            if cfg.tls_ca is None:
                raise ClientError("--unprotected-plaintext-j-bound sends some updates in plaintext: it needs TLS to "
                                  "the coordinator (--tls-ca), so that only the coordinator can read them")
        if cfg.device_ca is not None:
            try:
                self.device_ca = x509.load_pem_x509_certificate(Path(cfg.device_ca).read_bytes())
            except (OSError, ValueError) as e:
                raise ClientError(f"--device-ca {cfg.device_ca}: not a readable PEM certificate ({e})") from None
        if cfg.threads:
            import torch

            torch.set_num_threads(cfg.threads)
        try:
            x = load_interactions(cfg.dataset, cfg.data_dir, cfg.seed)
            if cfg.platform is None:
                check_users_fit(numbers, x.n_users, x.name)
            self.store = ClientStore(cfg.state_dir).open()
            self.store.check_client({"dataset": x.name, "split_seed": cfg.seed, "client_name": self.name})
            if cfg.platform is not None:
                self.hosted = [Device(cfg.platform.platform, self.store.device(platform_local_id(cfg.platform)))]
                self.trainer = PlatformTrainer(
                    x, cfg.platform, self.hosted[0], seed=cfg.seed, torch_device=cfg.device,
                    global_path=self.store.root / "global.fms",
                )
                created = 0
            else:
                self.hosted = [Device(n, self.store.device(local_id_of(n))) for n in numbers]
                data = LocalData(x, self.hosted, split_seed=cfg.seed)
                self.trainer = Trainer(
                    data, seed=cfg.seed, torch_device=cfg.device, global_path=self.store.root / "global.fms",
                )
                created = data.prepare()
            self.store.enrolled(cfg.coordinator)  # a damaged enrolment record stops the client here, named
            for h in self.hosted:
                h.identity_key = Ed25519PrivateKey.from_private_bytes(h.store.load_or_create_identity())
        except (DatasetError, UserRangeError, StateError, TrainingError) as e:
            self.close()
            raise ClientError(str(e)) from None
        log.info(
            "hosting %d device(s) of %s (users %s) in %s; %d new local split(s)",
            len(self.hosted), x.name, format_user_ranges(numbers), cfg.state_dir, created,
        )
        return self

    def close(self) -> None:
        if self.store is not None:
            self.store.close()

    # ------------------------------------------------------------ enrolment
    async def enroll_devices(self, stub, *, only: list[str] | None = None) -> dict[str, int]:
        """local_id -> device_id for every hosted device; enrols (and persists)
        those not yet enrolled with this coordinator."""
        assert self.store is not None
        known = self.store.enrolled(self.config.coordinator)
        by_local = {h.local_id: h for h in self.hosted}
        todo = only if only is not None else [lid for lid in by_local if lid not in known]
        if todo:
            got = await enroll(
                stub, self.transport, client_name=self.name,
                devices=[(lid, by_local[lid].require_identity_key()) for lid in todo],
            )
            self.store.save_enrolled(self.config.coordinator, got)
            known.update(got)
            log.info("enrolled %d device(s) with %s", len(got), self.config.coordinator)
        return {lid: known[lid] for lid in by_local}

    def _make_driver(self, ids: dict[str, int]) -> SessionDriver:
        assert self.trainer is not None
        for h in self.hosted:
            h.device_id = ids[h.local_id]
        if self.device_ca is not None:
            self._request_certificates()
        declined = decline_unfinished_rounds(self.hosted)
        if declined:
            log.warning("%d device(s) had an unfinished round from before the restart: declined", declined)
        return SessionDriver(
            client_name=self.name,
            client_version=CLIENT_VERSION,
            devices=self.hosted,
            trainer=self.trainer,
            faults=self.config.faults,
            on_round_end=self._on_round_end,
            debug_inputs_dir=(self.store.root / "debug" / "inputs") if self.config.debug_record_inputs and self.store else None,
            allow_insecure_plaintext=self.config.allow_insecure_plaintext,
            recommendations=self.config.recommendations,
            cohort_floor=self.config.cohort_floor,
            dp_floor=self.config.dp_floor,
            contribution_rule=self.config.contribution_rule,
            device_ca=self.device_ca,
            unprotected_plaintext_j_bound=self.config.unprotected_plaintext_j_bound,
        )

    def _request_certificates(self) -> None:
        """Device CA mode: every device without a valid identity certificate
        for its current device id writes a certificate request for the
        operator (`fedmask certs issue-device`); it takes part once the
        certificate is in place (read at each round)."""
        assert self.device_ca is not None
        for h in self.hosted:
            why = own_certificate_refusal(h, self.device_ca)
            if why is None:
                continue
            path = write_certificate_request(h)
            log.warning("%s: %s; certificate request written to %s: sign it with the device CA "
                        "(fedmask certs issue-device --device-ca-dir DIR %s)", h.local_id, why, path, path)

    def _on_round_end(self, event: RoundEvent) -> None:
        self.events.append(event)
        self.rounds_done += 1
        if event.outcome in ("committed", "aborted") and self.config.faults.should_crash_after(event.round_number):
            log.warning("--crash-after-round %d: exiting abruptly now", self.config.faults.crash_after_round)
            logging.shutdown()
            self.config.faults.crash()
        if self.config.exit_after_rounds is not None and self.rounds_done >= self.config.exit_after_rounds:
            log.info("took part in %d round(s): stopping (--exit-after-rounds)", self.rounds_done)
            self.stop()

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    async def _reenroll_unknown(self, stub) -> None:
        """Devices the coordinator does not know (e.g. its database was reset) enrol again."""
        d = self.driver
        assert d is not None and self.store is not None
        try:
            await self._reenroll(stub, d)
        except Exception as e:  # noqa: BLE001 - logged; the session goes on with the others
            log.error("re-enrolment failed: %s", e)

    async def _reenroll(self, stub, d: SessionDriver) -> None:
        unknown = [r.device_id for r in d.last_rejections
                   if r.reason == session_pb2.DEVICE_REJECTION_REASON_UNKNOWN_DEVICE and r.device_id in d.devices]
        if not unknown:
            return
        lids = [d.devices[i].local_id for i in unknown]
        log.warning("coordinator does not know %d of our device(s); enrolling them again", len(lids))
        got = await self.enroll_devices(stub, only=lids)
        for old in unknown:
            dev = d.devices.pop(old)
            dev.device_id = got[dev.local_id]
            d.devices[dev.device_id] = dev
        d.outbox.put_nowait(d.check_in_message())

    # ------------------------------------------------------------ main loop
    async def run(self) -> int:
        """Enrol and serve sessions until stopped; returns the exit code."""
        self._stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread / Windows
            loop.add_signal_handler(signal.SIGTERM, self.stop)
        log.info("connecting to %s (%s)", self.config.coordinator, self.transport.mode)
        attempt = 0
        channel = make_channel(self.transport, attempt)
        stopper = asyncio.ensure_future(self._stop.wait())
        try:
            while not self._stop.is_set():
                if attempt and len(self.transport.targets) > 1:  # the next replica of the list
                    await channel.close()
                    channel = make_channel(self.transport, attempt)
                    log.info("connecting to %s", self.transport.for_attempt(attempt))
                stub = coordinator_service_pb2_grpc.CoordinatorServiceStub(channel)
                attempt += 1
                work = asyncio.ensure_future(self._connect_once(stub))
                done, _ = await asyncio.wait([work, stopper], return_when=asyncio.FIRST_COMPLETED)
                if stopper in done:
                    while not work.done():  # re-cancel: a cancellation can be swallowed by a racing await
                        work.cancel()
                        await asyncio.wait([work], timeout=1.0)
                    if not work.cancelled():
                        work.exception()  # retrieved: nothing to report on a requested stop
                    break
                try:
                    work.result()
                    delay_hint = self.driver.retry_after if self.driver else None
                except FatalSessionError as e:
                    log.error("%s", e)
                    return 2
                except StateError as e:  # a damaged state file: retrying cannot help
                    log.error("%s", e)
                    return 2
                except grpc.aio.AioRpcError as e:
                    if e.code() in FATAL_CODES:
                        log.error("%s", describe_rpc_error(e, self.transport))
                        return 2
                    log.warning("%s", describe_rpc_error(e, self.transport))
                    # a refusal that says when to come back (rate limits) is honoured
                    delay_hint = retry_pushback_s(e.trailing_metadata())
                except (ConnectionError, asyncio.TimeoutError, OSError) as e:
                    log.warning("session lost: %s", e or type(e).__name__)
                    delay_hint = None
                except Exception as e:  # noqa: BLE001 - keep the process up; reconnect
                    log.error("session failed: %s: %s", type(e).__name__, e)
                    delay_hint = None
                if self._stop.is_set():
                    break
                if delay_hint is not None:
                    log.info("reconnecting in %.1fs (as the coordinator asked)", delay_hint)
                    pause = asyncio.ensure_future(asyncio.sleep(delay_hint))
                else:
                    delay = self.backoff.next_delay()
                    log.info("reconnecting in %.2fs (attempt %d)", delay, self.backoff.attempt)
                    pause = asyncio.ensure_future(self.backoff.sleep(delay))
                await asyncio.wait([pause, stopper], return_when=asyncio.FIRST_COMPLETED)  # a stop cuts the wait
                pause.cancel()
            return 0
        finally:
            stopper.cancel()
            await channel.close()

    async def _connect_once(self, stub) -> None:
        ids = await self.enroll_devices(stub)
        if self.driver is None:
            self.driver = self._make_driver(ids)
        driver = self.driver

        def welcomed() -> None:
            self.backoff.reset()
            asyncio.ensure_future(self._reenroll_unknown(stub))

        await run_session(stub, self.transport, driver, on_welcome=welcomed)


def run_client(config: ClientConfig) -> int:
    """Prepare and run until interrupted; returns the process exit code."""
    client = EdgeClient(config)
    try:
        client.prepare()
    except ClientError as e:
        log.error("%s", e)
        return 2
    # A 1 ms GIL switch interval (CPython's default is 5 ms): a top-k query and
    # the event loop get the GIL back sooner from the secagg compute thread;
    # `fedmask bench admin` measured top-k p99 100-111 ms against 118-142 ms (D76)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    try:
        return asyncio.run(client.run())
    except KeyboardInterrupt:
        log.info("interrupted; bye")
        return 130
    finally:
        client.close()
