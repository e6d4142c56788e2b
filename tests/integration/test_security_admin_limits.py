"""Hostile callers of the admin service and of the coordinator's admin
listener, over real processes on 127.0.0.1.

One `fedmask coordinator` (token auth from a token file on the device
listener, an admin listener with its own token file, 1 s heartbeats, no round
ever opens), one `fedmask client` hosting two devices with a device token of
that file, and one `fedmask admin` with an API token per role and small
limits set through its environment. In file order:

- oversized requests (10 bodies of 200 MiB, 10 headers of 64 MiB, all at
  once, without any token) are refused 413 / 431 before the service reads
  them: its resident memory grows by at most 20 MB and a viewer's reads keep
  answering meanwhile;
- more requests than `limits.max_concurrent_requests` are 503 at once, a
  request that takes longer than `limits.request_timeout_s` is ended 503, a
  request head that takes longer than `limits.head_timeout_s` is cut (408);
- one viewer token holds at most its share of the event streams, viewers
  together never the operators' reserved ones;
- a viewer's POST to an operator route (403) lands in the audit log;
- removing a token from the coordinator's token files ends the streams
  opened with it within a heartbeat interval: the client's Session (its
  devices are no longer connected, so no longer selectable) and an admin
  WatchEvents stream.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import pytest
from integration_harness import (
    LOOPBACK,
    Processes,
    client_args,
    coordinator_args,
    events,
    free_port,
    wait_serving,
    wait_until,
)

from admin.auth import token_hash
from fedmask.bench.admin_attacks import read_status_line, status_of
from fedmask.bench.processes import Child, rss_mb
from fedmask_proto.v1 import admin_service_pb2 as pb
from fedmask_proto.v1 import admin_service_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

HEARTBEAT_S = 1.0
MiB = 1 << 20
DEVICE_TOKENS = {"kept": "device-token-kept-" + "k" * 32, "removed": "device-token-removed-" + "r" * 32}
ADMIN_TOKENS = {"service": "admin-listener-service-" + "s" * 32, "removed": "admin-listener-removed-" + "w" * 32}
API = {"operator-1": ("operator", "operator-token-" + "o" * 32), **{
    f"viewer-{i}": ("viewer", f"viewer-{i}-token-" + "v" * 32) for i in range(1, 5)},
    "recommender-1": ("recommender", "recommender-token-" + "r" * 32)}
# The admin service's limits in this test (env FEDMASK_ADMIN_...).
MAX_CONCURRENT = 12
REQUEST_TIMEOUT_S = 3.0
HEAD_TIMEOUT_S = 2.0
STREAMS, PER_TOKEN, RESERVED = 8, 2, 2
COORDINATOR_WATCHERS = 12  # the coordinator's admin.max_watchers: more than the admin service's STREAMS


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {API[name][1]}"}


@dataclass
class World:
    tmp: Path
    coordinator: Child
    client: Child
    admin: Child
    base: str
    http_port: int
    admin_listener: str
    device_token_file: Path
    admin_token_file: Path

    @property
    def everyone(self) -> list[Child]:
        return [self.coordinator, self.client, self.admin]


def write_tokens(path: Path, tokens: list[str]) -> None:
    path.write_text("# accepted tokens\n" + "".join(t + "\n" for t in tokens))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("security-admin")
    procs = Processes(tmp)
    try:
        yield start(procs, tmp)
    finally:
        procs.close()


def start(procs: Processes, tmp: Path) -> World:
    db = f"sqlite:///{tmp / 'coordinator.db'}"
    device_tokens, admin_tokens = tmp / "device-tokens", tmp / "admin-tokens"
    write_tokens(device_tokens, list(DEVICE_TOKENS.values()))
    write_tokens(admin_tokens, list(ADMIN_TOKENS.values()))
    port, admin_port, http_port = free_port(), free_port(), free_port()
    coordinator = procs.start("coordinator", coordinator_args(
        port, db, model="synthetic", model_params={"vector_length": 8}, cohort_size=8, cohort_minimum=8,
        selection_deadline=600, seed=1, dp_mode="none", heartbeat_interval=HEARTBEAT_S,
        auth="token", token_file=device_tokens, admin_listen=f"{LOOPBACK}:{admin_port}",
        admin_token_file=admin_tokens,
    ), env={"FEDMASK_ADMIN__MAX_WATCHERS": str(COORDINATOR_WATCHERS)})
    wait_serving(port, coordinator, credentials=None)
    client = procs.start("client", client_args(port, "1-2", tmp / "client", dataset="synthetic", seed=2, threads=1),
                         env={"FEDMASK_TOKEN": DEVICE_TOKENS["removed"]})
    tokens = [{"name": name, "role": role, "sha256": token_hash(token)} for name, (role, token) in API.items()]
    admin = procs.start("admin", ["admin", "--listen", f"{LOOPBACK}:{http_port}", "--database-url", db,
                                  "--coordinator", f"{LOOPBACK}:{admin_port}", "--log-level", "WARNING"], env={
        "FEDMASK_ADMIN_COORDINATOR__TOKEN": ADMIN_TOKENS["service"],
        "FEDMASK_ADMIN_TOKENS": json.dumps(tokens),
        "FEDMASK_ADMIN_LIMITS__MAX_CONCURRENT_REQUESTS": str(MAX_CONCURRENT),
        "FEDMASK_ADMIN_LIMITS__REQUEST_TIMEOUT_S": str(REQUEST_TIMEOUT_S),
        # every call to the coordinator fits in the request time
        "FEDMASK_ADMIN_COORDINATOR__CALL_TIMEOUT_S": "2", "FEDMASK_ADMIN_COORDINATOR__TOPK_TIMEOUT_S": "0.5",
        "FEDMASK_ADMIN_LIMITS__HEAD_TIMEOUT_S": str(HEAD_TIMEOUT_S),
        "FEDMASK_ADMIN_EVENT_STREAMS__MAX_STREAMS": str(STREAMS),
        "FEDMASK_ADMIN_EVENT_STREAMS__PER_TOKEN": str(PER_TOKEN),
        "FEDMASK_ADMIN_EVENT_STREAMS__OPERATOR_RESERVED": str(RESERVED),
    })
    w = World(tmp, coordinator, client, admin, f"http://{LOOPBACK}:{http_port}", http_port,
              f"{LOOPBACK}:{admin_port}", device_tokens, admin_tokens)

    def ready() -> bool:
        try:
            return httpx.get(w.base + "/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(ready, 60, what="the admin service ready", watch=w.everyone, step=0.1)
    wait_until(lambda: live_state(w).devices.connected == 2, 60, what="the client's two devices connected",
               watch=w.everyone, step=0.1)
    return w


def live_state(w: World) -> pb.LiveState:
    with grpc.insecure_channel(w.admin_listener) as ch:
        return pb_grpc.CoordinatorAdminStub(ch).GetLiveState(
            pb.GetLiveStateRequest(), metadata=(("authorization", f"Bearer {ADMIN_TOKENS['service']}"),), timeout=5)


# ------------------------------------------------------------------ raw HTTP


@dataclass
class Outcome:
    status: int | None  # the status line's code; None: no answer
    sent: int  # bytes the attacker got onto the socket
    seconds: float  # until the answer (or the attacker gave up)


def send_until_answered(port: int, parts: Iterator[bytes], *, give_up_s: float) -> Outcome:
    """Send `parts` on a fresh connection while the server has not answered;
    stop at its answer, when it closes, or after `give_up_s` seconds."""
    t0 = time.monotonic()
    sent = 0
    with socket.create_connection((LOOPBACK, port), timeout=5) as s:
        s.setblocking(False)
        pending = b""
        while time.monotonic() - t0 < give_up_s:
            if not pending:
                pending = next(parts, b"")
            readable, writable, _ = select.select([s], [s] if pending else [], [], 0.2)
            if readable:
                break
            if writable and pending:
                try:
                    n = s.send(pending[:1 << 18])
                except (BrokenPipeError, ConnectionResetError):
                    break
                sent += n
                pending = pending[n:]
        s.setblocking(True)
        s.settimeout(max(0.5, give_up_s - (time.monotonic() - t0)))
        answer = read_status_line(s)
    return Outcome(status_of(answer), sent, time.monotonic() - t0)


def big_header(target: str, size: int) -> Iterator[bytes]:
    yield f"GET {target} HTTP/1.1\r\nHost: x\r\nX-Filler: ".encode()
    chunk = b"a" * (1 << 18)
    for _ in range(size // len(chunk)):
        yield chunk
    yield b"\r\n\r\n"


def big_body(target: str, size: int, *, chunked: bool) -> Iterator[bytes]:
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
    yield (f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{framing}\r\n\r\n").encode()
    chunk = b" " * (1 << 18)
    for _ in range(size // len(chunk)):
        yield (b"40000\r\n" + chunk + b"\r\n") if chunked else chunk
    if chunked:
        yield b"0\r\n\r\n"


@dataclass
class Sampler:
    """VmRSS of a process every 10 ms, in a thread, until stopped."""

    pid: int
    samples: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = rss_mb(self.pid)
            if rss is not None:
                self.samples.append(rss)
            self._stop.wait(0.01)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def baseline_rss(pid: int) -> float:
    values = []
    for _ in range(5):
        values.append(rss_mb(pid) or 0.0)
        time.sleep(0.05)
    return max(values)


def warm_up(w: World) -> None:
    """Every code path of the attack once, so the baseline includes what they import and cache."""
    for _ in range(3):
        assert httpx.get(w.base + "/v1/rounds", headers=bearer("viewer-1"), timeout=5).status_code == 200
    send_until_answered(w.http_port, big_header("/v1/rounds", 1 * MiB), give_up_s=5)
    send_until_answered(w.http_port, big_body("/v1/federation/pause", 1 * MiB, chunked=False), give_up_s=5)
    send_until_answered(w.http_port, big_body("/v1/federation/pause", 1 * MiB, chunked=True), give_up_s=5)


# --------------------------------------------------------------------- tests


def test_oversized_requests_are_refused_before_they_are_read(world: World) -> None:
    w = world
    warm_up(w)
    before = baseline_rss(w.admin.pid)
    attacks = [big_body("/v1/federation/pause", 200 * MiB, chunked=i % 2 == 1) for i in range(10)]
    attacks += [big_header("/v1/rounds", 64 * MiB) for _ in range(10)]
    outcomes: list[Outcome | None] = [None] * len(attacks)
    reads: list[tuple[int, float]] = []
    done = threading.Event()

    def attacker(i: int) -> None:
        outcomes[i] = send_until_answered(w.http_port, attacks[i], give_up_s=15)

    def viewer() -> None:
        with httpx.Client(timeout=5) as c:
            while not done.is_set():
                t0 = time.monotonic()
                try:
                    status = c.get(w.base + "/v1/rounds", headers=bearer("viewer-1")).status_code
                except httpx.HTTPError:
                    status = 0
                reads.append((status, time.monotonic() - t0))
                done.wait(0.02)

    threads = [threading.Thread(target=attacker, args=(i,)) for i in range(len(attacks))]
    reader = threading.Thread(target=viewer)
    with Sampler(w.admin.pid) as rss:
        reader.start()
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        time.sleep(max(0.2, 1.0 - (time.monotonic() - t0)))  # the viewer reads for at least 1 s from the start
        done.set()
        reader.join(15)
    grown = max(rss.samples) - before
    body, head = outcomes[:10], outcomes[10:]
    problems = []
    if grown > 20:
        problems.append(f"the admin service's RSS grew by {grown:.1f} MB (from {before:.1f} MB)")
    if [o.status for o in body if o] != [413] * 10:
        problems.append(f"200 MiB bodies answered {[o.status if o else None for o in body]}, not 413 each")
    if [o.status for o in head if o] != [431] * 10:
        problems.append(f"64 MiB headers answered {[o.status if o else None for o in head]}, not 431 each")
    slow = [o for o in body + head if o is None or o.sent >= 32 * MiB or o.seconds >= 5]
    if slow:  # each refused long before its end
        problems.append(f"{len(slow)} oversized requests were read on: {slow[:3]}")
    bad_reads = [(status, round(s, 2)) for status, s in reads if status != 200 or s >= 3]
    if len(reads) < 5 or bad_reads:
        problems.append(f"{len(bad_reads)} of {len(reads)} viewer reads failed or took >= 3 s: {bad_reads[:5]}")
    print(f"admin RSS {before:.1f} MB, grew at most {grown:.1f} MB; most bytes an attacker got onto its socket "
          f"{max(o.sent for o in body + head if o) / MiB:.1f} MiB; {len(reads)} viewer reads, slowest "
          f"{max((s for _, s in reads), default=0):.2f} s")
    assert not problems, "\n".join(problems)
    assert w.admin.alive(), w.admin.tail()


def test_concurrency_request_time_and_head_time_are_bounded(world: World) -> None:
    w = world
    # MAX_CONCURRENT requests whose bodies never arrive in full hold every request slot ...
    slow = [socket.create_connection((LOOPBACK, w.http_port), timeout=10) for _ in range(MAX_CONCURRENT)]
    try:
        t0 = time.monotonic()
        for s in slow:
            s.sendall(b"POST /v1/federation/pause HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{\"reason\": ")
        time.sleep(0.3)
        # ... so the next request is refused at once with a hint
        busy = httpx.get(w.base + "/v1/rounds", headers=bearer("viewer-1"), timeout=5)
        assert busy.status_code == 503 and busy.elapsed.total_seconds() < 1, busy
        assert int(busy.headers["retry-after"]) >= 1
        # a head that never ends is cut after HEAD_TIMEOUT_S
        head = socket.create_connection((LOOPBACK, w.http_port), timeout=10)
        head.sendall(b"GET /v1/rounds HTTP/1.1\r\nHost: x\r\n")
        h0 = time.monotonic()
        answer = head.recv(4096)
        assert status_of(answer) == 408 and HEAD_TIMEOUT_S - 0.5 <= time.monotonic() - h0 <= HEAD_TIMEOUT_S + 1.5
        head.close()
        # the slow requests end 503 after REQUEST_TIMEOUT_S, and the slots are free again
        answers = [s.recv(4096) for s in slow]
        assert [status_of(a) for a in answers] == [503] * MAX_CONCURRENT, answers
        assert REQUEST_TIMEOUT_S - 0.5 <= time.monotonic() - t0 <= REQUEST_TIMEOUT_S + 2.0
    finally:
        for s in slow:
            s.close()
    assert httpx.get(w.base + "/v1/rounds", headers=bearer("viewer-1"), timeout=5).status_code == 200


def test_one_token_holds_only_its_share_of_the_event_streams(world: World) -> None:
    w = world
    with contextlib.ExitStack() as stack:
        client = stack.enter_context(httpx.Client(timeout=10, limits=httpx.Limits(max_connections=100)))

        def open_stream(name: str) -> int:
            response = stack.enter_context(client.stream("GET", w.base + "/v1/events", headers=bearer(name)))
            return response.status_code

        # one viewer asks for more streams than the coordinator has watchers, then an operator asks for one
        hog = [open_stream("viewer-1") for _ in range(COORDINATOR_WATCHERS + 2)]
        operator = open_stream("operator-1")
        assert (operator, hog) == (200, [200] * PER_TOKEN + [429] * (len(hog) - PER_TOKEN)), (operator, hog)
        others = [open_stream(v) for v in ("viewer-2", "viewer-2", "viewer-3", "viewer-3")]
        assert others == [200] * 4, others  # STREAMS - RESERVED slots taken by viewers now
        assert open_stream("viewer-4") == 503  # the rest is the operators'
        assert open_stream("operator-1") == 200
    # every stream closed: the slots are free again
    with httpx.Client(timeout=10) as client:
        def opens() -> bool:
            with client.stream("GET", w.base + "/v1/events", headers=bearer("viewer-4")) as r:
                return r.status_code == 200
        wait_until(opens, 10, what="a viewer's stream once the others closed", watch=w.everyone, step=0.2)


def test_a_refused_operator_action_is_audited(world: World) -> None:
    w = world
    for name in ("viewer-1", "recommender-1"):
        r = httpx.post(w.base + "/v1/federation/pause", headers=bearer(name), json={"reason": "try"}, timeout=5)
        assert r.status_code == 403, r.text

    def refusals() -> list[dict[str, object]]:
        items = httpx.get(w.base + "/v1/audit", headers=bearer("operator-1"), timeout=5).json()["items"]
        return [e for e in items if str(e["outcome"]).startswith("refused")]

    found = wait_until(lambda: len(refusals()) >= 2 and refusals(), 10, what="the refusals in the audit log",
                       watch=w.everyone, step=0.2)
    assert {(e["operator"], e["action"]) for e in found} == {("viewer-1", "pause"), ("recommender-1", "pause")}, found
    # a flood of refusals is audited at a bounded rate, not one row each
    for _ in range(30):
        httpx.post(w.base + "/v1/federation/resume", headers=bearer("viewer-2"), timeout=5)
    time.sleep(1.0)
    flood = [e for e in refusals() if e["operator"] == "viewer-2"]
    assert 1 <= len(flood) <= 10, flood


def test_a_removed_token_ends_the_streams_opened_with_it(world: World) -> None:
    w = world
    assert live_state(w).devices.connected == 2
    watch_end: dict[str, float] = {}
    watch_code: list[grpc.StatusCode] = []

    def watch() -> None:
        with grpc.insecure_channel(w.admin_listener) as ch:
            call = pb_grpc.CoordinatorAdminStub(ch).WatchEvents(
                pb.WatchEventsRequest(), metadata=(("authorization", f"Bearer {ADMIN_TOKENS['removed']}"),))
            try:
                for _ in call:
                    watch_end.setdefault("open", time.monotonic())
            except grpc.RpcError as exc:
                watch_code.append(exc.code())
            watch_end["at"] = time.monotonic()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    wait_until(lambda: "open" in watch_end, 10, what="the watch stream open", watch=w.everyone, step=0.05)
    write_tokens(w.device_token_file, [DEVICE_TOKENS["kept"]])
    write_tokens(w.admin_token_file, [ADMIN_TOKENS["service"]])
    t0 = time.monotonic()
    wait_until(lambda: live_state(w).devices.connected == 0, 5, what="the removed token's devices gone",
               watch=[w.coordinator, w.admin], step=0.05)
    gone = time.monotonic() - t0
    print(f"the removed token's devices left the connected set {gone:.2f} s after the token file changed")
    assert gone <= HEARTBEAT_S + 0.5
    watcher.join(5)
    assert watch_code == [grpc.StatusCode.UNAUTHENTICATED], watch_code
    assert watch_end["at"] - t0 <= HEARTBEAT_S + 0.5
    ended = [e for e in events(w.coordinator.log()) if e.get("why", "").startswith("bearer token withdrawn")]
    assert ended, w.coordinator.tail()
    # the kept token still works; the admin service (its own token kept) still reads the live state
    assert httpx.get(w.base + "/v1/federation", headers=bearer("viewer-1"), timeout=5).status_code == 200
