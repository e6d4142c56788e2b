"""`fedmask bench hostile`: a coordinator with live rounds under hostile traffic.

One coordinator (SQLite in a temp folder, the `synthetic` model) runs secure
rounds for `seconds` with H honest devices in P edge-client processes and
two hostile client processes inside the cohorts:

- `hostile-shares` (`--fault-garbage-shares`): its devices seal random
  bytes instead of their shares (reported at the share check);
- `hostile-metrics` (`--fault-garbage-metrics`): its devices put 2^32 - 1
  in every metric coordinate of their masked input (A1/D);
- `hostile-reports-0..2`, a coalition of 3 credentials that false-reports
  (`--fault-false-reports-about IDS`): once the first round has committed,
  three client processes of one device each join, and each device names
  `FALSE_REPORT_TARGETS` honest devices undecryptable at every share check
  (and follows the protocol otherwise, so it stays in the rounds and its
  reports count: the case the per-credential quota of D37 bounds). The
  bench runs without per-client credentials (no mTLS), and a device
  enrolled without a client identity is its own credential (D37), so one
  device per process makes 3 credentials. At most
  N = floor(3 * quota / reporters) = 2 honest devices may be quarantined
  per report window; the others accused are refused by the quota.

Once the first round has committed, the bench process itself sends for
`seconds`, each kind at `rate` per second:

- `random_bytes`: TCP connections to the gRPC port that send random bytes;
- `malformed`: Session streams whose first message is empty or undecodable,
  and Enroll calls with keys of the wrong length;
- `oversized`: a Hello whose protocol version is 4 MiB;
- `out_of_order`: Session streams that say Hello for no device, then send
  masked inputs, unmasking responses and share receipts of rounds they are
  not in;
- `enrol_flood`: Enroll calls of 50 fresh devices each, half of them
  signed over a fresh challenge (keys the sender holds), half with forged
  possession signatures; the coordinator's limits and checks decide;
- `huge_ids`: Session streams carrying, in one 64-bit integer field of a
  ClientMessage picked at random among all of them (a device id, a round
  number, a peer in a share receipt, a heartbeat's clock...), a value
  the store cannot hold: 2^63 or 2^64 - 1 (-1 for a signed field). Each
  must be refused INVALID_ARGUMENT (D83); `huge_id_answers` counts the
  status codes they got.

Unless `admin` is off (`--no-admin`), the coordinator also opens its admin
listener, `fedmask admin` runs on it, and at the same `rate` the bench sends
it the traffic whose cost D82 bounds (fedmask/bench/admin_attacks.py):
64 MiB headers, 200 MiB bodies and bodies to routes that take none,
floods past the concurrent-request bound, slow heads, and one viewer token
hogging event streams, while an honest viewer and operator read.

Result (last stdout line, JSON): `ok`, `coordinator_crashes` (the
coordinator exited before the bench stopped it), `rounds_committed`,
`rounds_aborted` (rounds aborted for any reason but the bench's own stop),
`aggregates_exact` (every committed round's sum equals, bit for bit, the
sum of its counted devices' encoded inputs as they recorded them),
`honest_devices_dropped` (honest devices dropped from any round), the
attack counts, `huge_id_answers`, `false_reports` (the coalition: the
devices it accused, `honest_quarantined`, its `bound` N,
`quota_refusals` logged, `rounds_committed_with_coalition` (counting its
devices) and `rounds_committed_after_quarantines` (after the last honest
quarantine started, or after it joined if it started none)) and the
per-round table, and `admin` (the admin service's part: answers by status
per kind, its RSS growth, the honest reads' latency; null with --no-admin).
`ok` = no crash, at least one round committed, none
aborted, every aggregate exact, no honest device dropped, no huge id
answered INTERNAL or UNKNOWN (an exception inside the coordinator), at most
N honest devices quarantined, rounds still committing after the
coalition spent its quota, and the admin part's own `ok`.
Every round has enough devices by construction (`_every_round_commits`):
whichever of the garbage-share devices and of the N accused devices are
out, the devices that stay reach the threshold, and so does an accused
device's closure without its 3 accusers and the garbage-share devices.
"""

from __future__ import annotations

import random
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from fedmask.bench.admin_attacks import AdminBench
from fedmask.bench.loopback_federation import (
    StageDeadlines,
    exact_aggregate,
    read_rounds,
    start_client,
    start_coordinator,
)
from fedmask.bench.processes import LOOPBACK, ProcessFailed, ProcessGroup, free_port, split_users, wait_until, write_user_csv

ATTACKS = ("random_bytes", "malformed", "oversized", "out_of_order", "enrol_flood", "huge_ids")
#: What a huge id must never be answered: the coordinator raised inside.
EXCEPTION_CODES = ("INTERNAL", "UNKNOWN")
HOSTILE_DEVICES = 2  # per hostile client process
FALSE_REPORTERS = 3  # client processes of one device each: 3 credentials
FALSE_REPORT_TARGETS = 3  # honest devices each false reporter accuses: N + 1
_SESSION = "/fedmask.v1.CoordinatorService/Session"
_ENROLL = "/fedmask.v1.CoordinatorService/Enroll"


@dataclass(frozen=True)
class HostileBenchConfig:
    seconds: float = 120.0
    honest_devices: int = 12
    honest_processes: int = 2
    dim: int = 1000
    rate: float = 10.0  # attacks per second, per kind
    seed: int = 0
    keep: Path | None = None  # keep the work folder here (logs, database)
    admin: bool = True  # also run `fedmask admin` and its attacks (admin_attacks.py)

    def __post_init__(self) -> None:
        if self.seconds <= 0 or self.rate <= 0:
            raise ValueError("--seconds and --rate must be positive")
        if not _every_round_commits(self.honest_devices):
            raise ValueError("--honest-devices too few: with the hostile devices in a cohort, an accused honest "
                             "device's peers must still reach the threshold (at least 11)")


def _every_round_commits(honest: int) -> bool:
    """Whatever the quarantine leaves out (the garbage-share devices, up to N
    accused honest devices), the devices that stay in a round (honest, the
    garbage-metric ones, the false reporters) reach the strictest threshold
    of the cohort, floor(2n/3) + 1, and so does an accused device's closure
    once the share check removed its edges to the 3 false reporters and to
    the garbage-share devices."""
    from coordinator.peer_reports import ReportPolicy

    for garbage in (0, HOSTILE_DEVICES):
        for quarantined in range(ReportPolicy().bound(FALSE_REPORTERS) + 1):
            stay = honest - quarantined + HOSTILE_DEVICES + FALSE_REPORTERS
            n = stay + garbage
            t = 2 * n // 3 + 1
            if stay < t or n - garbage - FALSE_REPORTERS < t:
                return False
    return True


# ------------------------------------------------------------------ the attacks (each one attempt)


def _random_bytes(port: int, rng: random.Random) -> None:
    with socket.create_connection((LOOPBACK, port), timeout=2) as s:
        s.sendall(rng.randbytes(rng.randint(1, 4096)))


def _identity(b: bytes) -> bytes:
    return b


def _stream(channel: grpc.Channel, messages: list[bytes], timeout: float = 2.0) -> None:
    """Send raw serialized ClientMessages on a Session stream, read until it ends."""
    call = channel.stream_stream(_SESSION, request_serializer=_identity, response_deserializer=_identity)
    try:
        for _ in call(iter(messages), timeout=timeout):
            pass
    except grpc.RpcError:
        pass


def _malformed(channel: grpc.Channel, rng: random.Random) -> None:
    from fedmask_proto.v1 import enrollment_pb2, session_pb2

    choice = rng.randrange(3)
    if choice == 0:
        _stream(channel, [session_pb2.ClientMessage().SerializeToString()])
    elif choice == 1:
        _stream(channel, [rng.randbytes(rng.randint(1, 512))])
    else:
        req = enrollment_pb2.EnrollRequest(client_name="hostile", devices=[
            enrollment_pb2.DeviceEnrollment(local_id="x", identity_public_key=rng.randbytes(5))])
        enroll = channel.unary_unary(_ENROLL, request_serializer=_identity, response_deserializer=_identity)
        try:
            enroll(req.SerializeToString(), timeout=2)
        except grpc.RpcError:
            pass


def _oversized(channel: grpc.Channel, rng: random.Random) -> None:
    from fedmask_proto.v1 import session_pb2

    hello = session_pb2.Hello(client_name="hostile", protocol_version="v" * (4 << 20))
    _stream(channel, [session_pb2.ClientMessage(hello=hello).SerializeToString()])


def _out_of_order(channel: grpc.Channel, rng: random.Random) -> None:
    from fedmask_proto.v1 import secagg_pb2, session_pb2
    from wire.protocol import PROTOCOL_VERSION

    sid, number, device = rng.randbytes(16), rng.randint(1, 50), rng.randint(1, 20)
    msgs = [
        session_pb2.ClientMessage(hello=session_pb2.Hello(client_name="hostile", protocol_version=PROTOCOL_VERSION)),
        session_pb2.ClientMessage(masked_input=secagg_pb2.MaskedInput(
            session_id=sid, round_number=number, device_id=device, masked_vector=b"\0" * 16, length=4, modulus_bits=32)),
        session_pb2.ClientMessage(unmasking_response=secagg_pb2.UnmaskingResponse(
            session_id=sid, round_number=number, device_id=device)),
        session_pb2.ClientMessage(share_receipt=secagg_pb2.ShareReceipt(
            session_id=sid, round_number=number, device_id=device, undecryptable=[1, 2, 3])),
    ]
    _stream(channel, [m.SerializeToString() for m in msgs])


def _huge_ids(channel: grpc.Channel, rng: random.Random) -> str:
    """One Session stream with a value out of 0..2^63-1 in a random 64-bit
    integer field of a ClientMessage, where the stream's contract puts that
    message (a Hello first, DeviceProofs second, the rest after them); the
    status code name it ended with."""
    from fedmask_proto.v1 import session_pb2
    from wire.id_bounds import int64_field_paths, message_with, out_of_range_values
    from wire.protocol import PROTOCOL_VERSION

    C = session_pb2.ClientMessage
    path = rng.choice(int64_field_paths(C))
    bad = message_with(C, path, rng.choice(out_of_range_values(C, path)))
    hello = C(hello=session_pb2.Hello(client_name="hostile", protocol_version=PROTOCOL_VERSION))
    proof = C(proof=session_pb2.DeviceProofs())
    kind = path.split(".")[0]
    stream = [bad, proof] if kind == "hello" else [hello, bad] if kind == "proof" else [hello, proof, bad]
    call = channel.stream_stream(_SESSION, request_serializer=_identity, response_deserializer=_identity)
    try:
        for _ in call(iter([m.SerializeToString() for m in stream]), timeout=2.0):
            pass
    except grpc.RpcError as exc:
        return str(exc.code().name)
    return "OK"


def _enrol_flood(channel: grpc.Channel, rng: random.Random) -> None:
    """50 fresh devices per call: every other call properly signed over a
    fresh challenge (a token holder enrolling keys it holds), the others
    with forged possession signatures."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from edge_client.transport import signed_enroll_request
    from fedmask_proto.v1 import enrollment_pb2

    tag = rng.getrandbits(48)
    challenge_call = channel.unary_unary("/fedmask.v1.CoordinatorService/EnrollChallenge",
                                         request_serializer=_identity, response_deserializer=_identity)
    enroll = channel.unary_unary(_ENROLL, request_serializer=_identity, response_deserializer=_identity)
    try:
        raw = challenge_call(enrollment_pb2.EnrollChallengeRequest().SerializeToString(), timeout=2)
        challenge = enrollment_pb2.EnrollChallengeResponse.FromString(raw).challenge
        req = signed_enroll_request(challenge, "flood", [(f"flood-{tag}-{i}", Ed25519PrivateKey.generate())
                                                         for i in range(50)])
        if rng.random() < 0.5:
            for d in req.devices:
                d.possession_signature = rng.randbytes(len(d.possession_signature))
        enroll(req.SerializeToString(), timeout=2)
    except grpc.RpcError:
        pass


def _attacker(kind: str, port: int, rate: float, seed: int, stop: threading.Event,
              counts: dict[str, int], answers: dict[str, int]) -> Callable[[], None]:
    def run() -> None:
        rng = random.Random(f"{seed}-{kind}")
        options = [("grpc.max_send_message_length", 8 << 20), ("grpc.enable_retries", 0)]
        with grpc.insecure_channel(f"{LOOPBACK}:{port}", options=options) as channel:
            step = 1.0 / rate
            nxt = time.monotonic()
            while not stop.is_set():
                try:
                    if kind == "random_bytes":
                        _random_bytes(port, rng)
                    elif kind == "huge_ids":
                        code = _huge_ids(channel, rng)
                        answers[code] = answers.get(code, 0) + 1
                    else:
                        {"malformed": _malformed, "oversized": _oversized, "out_of_order": _out_of_order,
                         "enrol_flood": _enrol_flood}[kind](channel, rng)
                except OSError:
                    pass  # a refused or reset connection is an answer too
                counts[kind] += 1
                nxt += step
                stop.wait(max(0.0, nxt - time.monotonic()))
    return run


# ------------------------------------------------------------------ the run


def _committed(db: Path) -> int:
    """Rounds committed so far (0 while the database is not there yet)."""
    if not db.exists():
        return 0
    try:
        return sum(r.state.value == "committed" for r in read_rounds(db))
    except Exception:  # a schema not yet migrated, a busy database: ask again
        return 0


def _ids_of_users(db: Path, users: range) -> set[int]:
    """The enrolled device ids of the bench's users `users` (1-based rows of its csv)."""
    from coordinator.store import open_store
    from edge_client.devices import local_id_of

    wanted = {local_id_of(n) for n in users}
    store = open_store(f"sqlite:///{db}", migrate=False)
    try:
        return {d.id for d in store.list_devices() if d.local_id in wanted}
    finally:
        store.close()


def _quarantines(db: Path) -> list[Any]:
    from coordinator.store import open_store

    store = open_store(f"sqlite:///{db}", migrate=False)
    try:
        return store.list_quarantines()
    finally:
        store.close()


@dataclass
class _Coalition:
    """The false-report coalition of the run (see the module doc)."""

    users: range  # its users: one device per client process
    accused: list[int]  # the honest device ids it names undecryptable
    joined_after: int = 0  # the last round number before it joined

    def start(self, group: ProcessGroup, port: int, work: Path, client_flags: dict[str, Any]) -> list[Path]:
        """Its client processes; their state folders."""
        dirs = []
        for i, user in enumerate(self.users):
            state = work / f"hostile-reports-{i}"
            start_client(group, state.name, port, str(user), state,
                         {**client_flags, "fault_false_reports_about": ",".join(map(str, self.accused))})
            dirs.append(state)
        return dirs

    def result(self, db: Path, honest: set[int], committed: list[Any], coordinator_log: str) -> dict[str, Any]:
        from coordinator.peer_reports import ReportPolicy

        mine = _ids_of_users(db, self.users)
        held = [q for q in _quarantines(db) if q.device_id in honest]
        since = max((q.started_round for q in held), default=self.joined_after)
        return {
            "credentials": len(self.users),
            "accused": self.accused,
            "honest_quarantined": sorted({q.device_id for q in held}),
            "bound": ReportPolicy().bound(len(self.users)),
            "quota_refusals": coordinator_log.count("event=quarantine_refused"),
            "rounds_committed_with_coalition": sum(bool(mine & set(r.survivors.get("masked_input", [])))
                                                   for r in committed),
            "rounds_committed_after_quarantines": sum(r.number > since for r in committed),
        }


def run_hostile_bench(cfg: HostileBenchConfig, log: Any = print) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="fedmask-bench-hostile-"))
    try:
        return _run(cfg, root, log)
    finally:
        if cfg.keep is not None:
            shutil.copytree(root, cfg.keep, dirs_exist_ok=True)
        shutil.rmtree(root, ignore_errors=True)


def _run(cfg: HostileBenchConfig, work: Path, log: Any) -> dict[str, Any]:
    in_processes = cfg.honest_devices + 2 * HOSTILE_DEVICES  # the garbage ones' last user
    total = in_processes + FALSE_REPORTERS
    csv = write_user_csv(work / "users.csv", total, seed=cfg.seed)
    db = work / "coordinator.db"
    port = free_port()
    deadlines = StageDeadlines(training=5, advertise_keys=10, share_keys=10, share_check=10, masked_input=10,
                               unmasking=10, floor=1.0)
    coord_flags = {
        "database_url": f"sqlite:///{db}", "listen": f"{LOOPBACK}:{port}", "model": "synthetic",
        "model_params": {"vector_length": cfg.dim}, "cohort_size": total, "cohort_minimum": cfg.honest_devices,
        "over_selection": 0.0, "allow_consecutive": True, "seed": cfg.seed, "selection_deadline": 2,
        **deadlines.flags(), "secagg_graph": "full", "dp_mode": "none", "debug_record_sums": True,
        "log_level": "INFO",
    }
    honest_parts = split_users(1, cfg.honest_devices, cfg.honest_processes)
    first_hostile = cfg.honest_devices + 1
    roles: list[tuple[str, str, dict[str, Any]]] = [(f"honest-{i}", users, {}) for i, users in enumerate(honest_parts)] + [
        ("hostile-shares", f"{first_hostile}-{first_hostile + HOSTILE_DEVICES - 1}", {"fault_garbage_shares": True}),
        ("hostile-metrics", f"{first_hostile + HOSTILE_DEVICES}-{in_processes}", {"fault_garbage_metrics": True}),
    ]
    state_dirs = [work / name for name, _, _ in roles]
    client_flags = {"dataset": str(csv), "seed": cfg.seed, "debug_record_inputs": True, "threads": 1,
                    "no_dp_floor": True,  # the synthetic model runs without DP (D85)
                    "log_level": "warning"}
    coalition = _Coalition(users=range(in_processes + 1, total + 1), accused=[])
    counts = dict.fromkeys(ATTACKS, 0)
    huge_id_answers: dict[str, int] = {}
    stop = threading.Event()
    crashed = False
    admin = AdminBench(cfg.rate, cfg.seed) if cfg.admin else None
    with ProcessGroup(work, env={"OMP_NUM_THREADS": "1"}) as group:
        coord = start_coordinator(group, port, {**coord_flags, **(admin.coordinator_flags() if admin else {})},
                                  env=admin.coordinator_env() if admin else None)
        if admin:
            admin.start(group, f"sqlite:///{db}")
        for (name, users, extra), state in zip(roles, state_dirs, strict=True):
            start_client(group, name, port, users, state, {**client_flags, **extra})
        log(f"coordinator pid {coord.pid} on port {port}; {len(roles)} client processes "
            f"({cfg.honest_devices} honest devices, {2 * HOSTILE_DEVICES} hostile)")
        # The attacks target a running federation: they start once the first
        # round has committed (every device enrolled and connected). All
        # traffic here comes from 127.0.0.1, one peer for the per-peer limits,
        # so a flood started earlier would also throttle the honest clients'
        # own enrolment, which on a real network comes from other addresses.
        wait_until(lambda: _committed(db) >= 1, 120, what="the first round to commit", watch=group.children,
                   step=0.5)
        # The false-report coalition names honest devices by id, so it joins
        # now, and the traffic starts once a round has counted its devices.
        coalition.accused = sorted(_ids_of_users(db, range(1, cfg.honest_devices + 1)))[:FALSE_REPORT_TARGETS]
        coalition.joined_after = max(r.number for r in read_rounds(db))
        state_dirs += coalition.start(group, port, work, client_flags)
        wait_until(lambda: _coalition_counted(db, coalition), 120, what="a round counting the false reporters",
                   watch=group.children, step=0.5)
        if admin:
            admin.ready(watch=group.children)
        log(f"first round committed, false reporters in; attacks for {cfg.seconds:.0f} s")
        crashed = _traffic(cfg, port, coord, counts, huge_id_answers, stop, log, admin)
        if not crashed:
            group.stop(coord, grace=15.0)
        coordinator_log = coord.log()
    if not db.exists():
        raise ProcessFailed("the coordinator left no database")
    return _summary(cfg, db, state_dirs, coalition, coordinator_log, crashed=crashed, counts=counts,
                    huge_id_answers=huge_id_answers, admin=admin.result() if admin else None)


def _coalition_counted(db: Path, coalition: _Coalition) -> bool:
    if not db.exists():
        return False
    mine = _ids_of_users(db, coalition.users)
    return any(r.state.value == "committed" and mine & set(r.survivors.get("masked_input", []))
               for r in read_rounds(db) if r.number > coalition.joined_after)


def _traffic(cfg: HostileBenchConfig, port: int, coord: Any, counts: dict[str, int], huge_id_answers: dict[str, int],
             stop: threading.Event, log: Any, admin: AdminBench | None) -> bool:
    """The attack threads (the admin service's too) for `cfg.seconds`; True if the coordinator died meanwhile."""
    attackers = [threading.Thread(target=_attacker(k, port, cfg.rate, cfg.seed, stop, counts, huge_id_answers),
                                  daemon=True, name=f"attack-{k}") for k in ATTACKS]
    for t in attackers:
        t.start()
    if admin:
        admin.begin()
    crashed = False
    t_end = time.monotonic() + cfg.seconds
    last = time.monotonic()
    while time.monotonic() < t_end:
        if not coord.alive():
            crashed = True
            break
        time.sleep(0.5)
        if time.monotonic() - last >= 15:
            last = time.monotonic()
            log(f"{t_end - last:5.0f} s left; attacks so far {sum(counts.values())}")
    stop.set()
    if admin:
        admin.finish()
    for t in attackers:
        t.join(10)
    return crashed


def _summary(cfg: HostileBenchConfig, db: Path, state_dirs: list[Path], coalition: _Coalition, coordinator_log: str,
             *, crashed: bool, counts: dict[str, int], huge_id_answers: dict[str, int],
             admin: dict[str, Any] | None) -> dict[str, Any]:
    honest = _ids_of_users(db, range(1, cfg.honest_devices + 1))
    records = [r for r in read_rounds(db) if r.state.is_terminal]
    per_round = []
    committed: list[Any] = []
    aborted = 0
    exact_all = True
    honest_dropped: set[int] = set()
    for r in records:
        if r.state.value == "aborted" and r.abort_reason == "coordinator_shutdown":
            continue  # the bench's own stop
        dropped = {d for ids in r.dropouts.values() for d in ids}
        honest_dropped |= dropped & honest
        exact = r.state.value == "committed" and exact_aggregate(r, state_dirs)
        if r.state.value == "committed":
            committed.append(r)
        aborted += r.state.value == "aborted"
        exact_all = exact_all and (r.state.value != "committed" or exact)
        seconds = (r.ended_at - r.started_at).total_seconds() if r.ended_at else None
        per_round.append({"round": r.number, "state": r.state.value, "abort_reason": r.abort_reason,
                          "seconds": seconds, "counted": len(r.survivors.get("masked_input", [])), "exact": exact,
                          "dropped": sorted(dropped), "metrics_unavailable": bool(r.metrics.get("metrics_unavailable"))})
    raised = sum(huge_id_answers.get(code, 0) for code in EXCEPTION_CODES)
    reports = coalition.result(db, honest, committed, coordinator_log)
    bounded = len(reports["honest_quarantined"]) <= reports["bound"] and reports["rounds_committed_after_quarantines"] >= 1
    ok = not crashed and len(committed) >= 1 and aborted == 0 and exact_all and not honest_dropped and not raised
    return {
        "ok": ok and bounded and (admin is None or admin["ok"]),
        "coordinator_crashes": int(crashed),
        "rounds_committed": len(committed),
        "rounds_aborted": aborted,
        "aggregates_exact": exact_all,
        "honest_devices_dropped": len(honest_dropped),
        "attacks": counts,
        "huge_id_answers": huge_id_answers,
        "false_reports": reports,
        "admin": admin,
        "seconds": cfg.seconds,
        "rounds": per_round,
    }


__all__ = ["ATTACKS", "HostileBenchConfig", "run_hostile_bench"]
