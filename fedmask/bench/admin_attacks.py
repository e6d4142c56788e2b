"""The admin service's part of `fedmask bench hostile`: `fedmask admin` on the
bench's coordinator, under the traffic that D82 bounds.

`AdminBench` starts `fedmask admin` (the bench's SQLite store, the
coordinator's admin listener, one API token per role: an honest viewer, an
honest operator, and the hog's viewer token) with the service's default
limits (`admin.settings.RequestLimits`, `EventStreamSlots`) except
`head_timeout_s`, shortened to ADMIN_HEAD_TIMEOUT_S so that slow heads are
answered within a short run. While the device attacks run, one thread per
kind sends, `rate` attempts per second, none of them with a token but the
hog's:

- `oversized_head`: a request head with a 64 MiB header (expected 431);
- `oversized_body`: a 200 MiB JSON body to an operator action (POST
  /v1/federation/pause), by turns with a Content-Length and chunked
  (expected 413; a chunked one may be 503 while a flood holds every slot,
  see ALSO);
- `body_to_bodiless`: a 1 KiB body, below the body bound, to a route that
  takes none (GET /v1/rounds), by turns with a Content-Length and chunked
  (expected 413);
- `concurrency_flood`: `max_concurrent_requests` requests whose bodies never
  arrive hold every request slot, then one more request (expected 503); the
  flood's connections close once it is answered;
- `slow_head`: a connection that sends a head one byte per half second and
  never ends it (expected 408 after `head_timeout_s`); many in flight at
  once, every one waited for at the end;
- `stream_hog`: one viewer token holds its share of /v1/events streams
  (`per_token`, kept open all along) and asks for one more (expected 429).

Every body and header is streamed from a generator and the attacker stops
sending once it is answered (or the connection closes), so the attacker
stays cheap. Meanwhile the honest viewer reads GET /v1/rounds and the
honest operator GET /v1/federation (a live read through the coordinator),
each every READ_EVERY_S, and every second each opens its own /v1/events
stream; the admin service's VmRSS is sampled every 20 ms.

`AdminBench.result()`: per kind the attempts and their answers by status
(`none`: no answer), the most bytes one attempt got onto its socket; the
RSS growth over the baseline taken after a warm-up (every path once); per
honest role its reads by status and their p50 / p99 latency in ms, and its
own streams by status. Its `ok`: every attempt of every kind answered with
the kind's expected status (or one of ALSO), RSS growth <=
MAX_RSS_GROWTH_MB, every honest read answered (200, or 503 while a flood holds every slot: the concurrency
bound is checked before the token, so it does not tell callers apart), each
role with at least one 200, and every stream of the honest operator and
viewer accepted while the hog holds its share.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import select
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fedmask.bench.processes import LOOPBACK, Child, ProcessGroup, free_port, rss_mb, wait_until

MiB = 1 << 20
ADMIN_ATTACKS = ("oversized_head", "oversized_body", "body_to_bodiless", "concurrency_flood", "slow_head",
                 "stream_hog")
#: The answer each kind must get (D82). A chunked body to a route that takes
#: one passes the body check at the head and reaches the concurrency bound,
#: so while a flood holds every slot it is refused 503 before a byte of it
#: is read: also a refusal as expected.
ALSO = {"oversized_body": (503,)}
EXPECTED = {"oversized_head": 431, "oversized_body": 413, "body_to_bodiless": 413, "concurrency_flood": 503,
            "slow_head": 408, "stream_hog": 429}
ADMIN_HEAD_TIMEOUT_S = 2.0
MAX_RSS_GROWTH_MB = 20.0
READ_EVERY_S = 0.1
READ_TIMEOUT_S = 5.0
GIVE_UP_S = 15.0  # an attempt not answered by then counts as `none`
_HEAD = "/v1/rounds"  # a read route (takes no body)
_ACTION = "/v1/federation/pause"  # an operator action (takes a body)


# ------------------------------------------------------------------ raw HTTP, streamed


def status_of(answer: bytes) -> int | None:
    """The status code of an HTTP answer's status line; None if there is none."""
    line = answer.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) >= 2 and line[1].isdigit() else None


def read_status_line(s: socket.socket) -> bytes:
    """What `s` receives up to the end of the answer's status line (less if it
    closes or fails first; the socket's timeout applies)."""
    answer = b""
    with contextlib.suppress(OSError):
        while b"\r\n" not in answer:
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer


def big_head(target: str, size: int) -> Iterator[bytes]:
    """A GET whose one header is `size` bytes long, 256 KiB at a time."""
    yield f"GET {target} HTTP/1.1\r\nHost: x\r\nX-Filler: ".encode()
    chunk = b"a" * (1 << 18)
    for _ in range(size // len(chunk)):
        yield chunk
    yield b"\r\n\r\n"


def with_body(method: str, target: str, size: int, *, chunked: bool) -> Iterator[bytes]:
    """A request with a `size`-byte JSON-ish body (spaces), 256 KiB at a time."""
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
    yield f"{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{framing}\r\n\r\n".encode()
    left = size
    while left > 0:
        n = min(left, 1 << 18)
        left -= n
        yield (b"%x\r\n%s\r\n" % (n, b" " * n)) if chunked else b" " * n
    if chunked:
        yield b"0\r\n\r\n"


def send_until_answered(port: int, parts: Iterator[bytes], *, give_up_s: float = GIVE_UP_S) -> tuple[int | None, int]:
    """Send `parts` on a fresh connection while the server has not answered;
    stop at its answer, when it closes, or after `give_up_s`. (status, bytes sent)."""
    t0 = time.monotonic()
    sent, answer, pending = 0, b"", b""
    with socket.create_connection((LOOPBACK, port), timeout=5) as s:
        s.setblocking(False)
        while time.monotonic() - t0 < give_up_s:
            if not pending:
                pending = next(parts, b"")
            readable, writable, _ = select.select([s], [s] if pending else [], [], 0.2)
            if readable:
                break
            if writable and pending:
                try:
                    n = s.send(pending[:1 << 18])
                except OSError:
                    break
                sent += n
                pending = pending[n:]
        s.setblocking(True)
        s.settimeout(max(0.5, give_up_s - (time.monotonic() - t0)))
        answer = read_status_line(s)
    return status_of(answer), sent


def open_stream(port: int, token: str, timeout: float = READ_TIMEOUT_S) -> tuple[int | None, socket.socket]:
    """GET /v1/events with `token`; its status and the open socket (the caller closes it)."""
    s = socket.create_connection((LOOPBACK, port), timeout=timeout)
    s.sendall(f"GET /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
    return status_of(read_status_line(s)), s


def flood(port: int, slots: int, *, give_up_s: float = 5.0) -> int | None:
    """Hold `slots` request slots with bodies that never arrive, then ask
    once more until refused 503 (or `give_up_s`); the last answer's status.
    A held request that found the slots taken by others (then refused 503 and
    closed) leaves a gap: each answer but 503 adds one more held request, up
    to `slots` more. Every connection is closed before it returns."""
    held: list[socket.socket] = []

    def hold() -> None:
        s = socket.create_connection((LOOPBACK, port), timeout=5)
        held.append(s)
        s.sendall(f"POST {_ACTION} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  "Content-Length: 100\r\n\r\n{\"reason\": ".encode())

    try:
        for _ in range(slots):
            hold()
        end = time.monotonic() + give_up_s
        status: int | None = None
        while status != 503 and time.monotonic() < end:
            status, _ = send_until_answered(port, iter([f"GET {_HEAD} HTTP/1.1\r\nHost: x\r\n\r\n".encode()]),
                                            give_up_s=2.0)
            if status != 503 and len(held) < 2 * slots:
                hold()
        return status
    finally:
        for s in held:
            s.close()


# ------------------------------------------------------------------ the attackers


@dataclass
class Tally:
    """One kind's attempts and their answers by status (`none`: no answer)."""

    attempts: int = 0
    answers: dict[str, int] = field(default_factory=dict)
    max_sent_mib: float = 0.0

    def add(self, status: int | None, sent: int = 0) -> None:
        self.attempts += 1
        key = "none" if status is None else str(status)
        self.answers[key] = self.answers.get(key, 0) + 1
        self.max_sent_mib = max(self.max_sent_mib, round(sent / MiB, 2))

    def as_expected(self, status: int, *also: int) -> bool:
        """Attempted, and every answer `status` (or one of `also`)."""
        return self.attempts > 0 and set(self.answers) <= {str(s) for s in (status, *also)}


class SlowHeads:
    """Slow heads, many in flight: `open_one` starts one, `tick` trickles a
    byte to each due and reads the answers that came."""

    def __init__(self, port: int, tally: Tally) -> None:
        self.port, self.tally = port, tally
        self.live: dict[socket.socket, float] = {}  # socket -> when it next sends a byte
        self.started: dict[socket.socket, float] = {}

    def open_one(self) -> None:
        try:
            s = socket.create_connection((LOOPBACK, self.port), timeout=5)
            s.sendall(f"GET {_HEAD} HTTP/1.1\r\nHost: x\r\nX-Slow: ".encode())
        except OSError:
            self.tally.add(None)
            return
        s.setblocking(False)
        self.live[s] = self.started[s] = time.monotonic()

    def tick(self) -> None:
        now = time.monotonic()
        readable, _, _ = select.select(list(self.live), [], [], 0) if self.live else ([], [], [])
        for s in readable:
            answer = b""
            with contextlib.suppress(OSError):
                answer = s.recv(4096)
            self.end(s, status_of(answer))
        for s, due in list(self.live.items()):
            if now - self.started[s] > GIVE_UP_S:
                self.end(s, None)
            elif now >= due:
                try:
                    s.send(b"a")
                    self.live[s] = now + 0.5
                except OSError:
                    self.end(s, None)

    def end(self, s: socket.socket, status: int | None) -> None:
        self.tally.add(status)
        del self.live[s], self.started[s]
        s.close()


@dataclass
class Honest:
    """One honest role's reads (status 0: no answer) and its own streams."""

    reads: list[tuple[int, float]] = field(default_factory=list)
    streams: Tally = field(default_factory=Tally)

    def result(self) -> dict[str, Any]:
        by_status: dict[str, int] = {}
        for status, _ in self.reads:
            by_status[str(status or "none")] = by_status.get(str(status or "none"), 0) + 1
        ms = sorted(s * 1000 for status, s in self.reads if status)
        return {"reads": len(self.reads), "read_answers": by_status, "read_p50_ms": _pct(ms, 50),
                "read_p99_ms": _pct(ms, 99), "streams": self.streams.answers}

    def ok(self) -> bool:
        answered = all(status in (200, 503) for status, _ in self.reads)
        return answered and any(s == 200 for s, _ in self.reads) and self.streams.as_expected(200)


def _pct(sorted_ms: list[float], q: int) -> float | None:
    if not sorted_ms:
        return None
    if len(sorted_ms) == 1:
        return round(sorted_ms[0], 1)
    return round(statistics.quantiles(sorted_ms, n=100, method="inclusive")[q - 1], 1)


# ------------------------------------------------------------------ the service and the run


class AdminBench:
    """See the module doc: `coordinator_flags` / `coordinator_env` for the
    coordinator, then `start`, `ready`, `begin(stop)` beside the device
    attacks, `finish()` once `stop` is set, `result()`."""

    def __init__(self, rate: float, seed: int) -> None:
        from admin.settings import EventStreamSlots, RequestLimits

        self.rate, self.seed = rate, seed
        self.limits, self.slots = RequestLimits(head_timeout_s=ADMIN_HEAD_TIMEOUT_S), EventStreamSlots()
        self.admin_port, self.port = free_port(), free_port()
        self._coordinator_token = secrets.token_urlsafe(32)
        self.tokens = {role: secrets.token_urlsafe(32) for role in ("viewer", "operator", "hog")}
        self.tallies = {kind: Tally() for kind in ADMIN_ATTACKS}
        self.honest = {"viewer": Honest(), "operator": Honest()}
        self.child: Child | None = None
        self.baseline_mb = 0.0
        self.rss: list[float] = []
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()

    @property
    def base(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def coordinator_flags(self) -> dict[str, Any]:
        return {"admin_listen": f"{LOOPBACK}:{self.admin_port}"}

    def coordinator_env(self) -> dict[str, str]:
        return {"FEDMASK_ADMIN__TOKEN": self._coordinator_token}

    def start(self, group: ProcessGroup, database_url: str) -> Child:
        from admin.auth import token_hash

        tokens = [{"name": f"bench-{role}", "role": "operator" if role == "operator" else "viewer",
                   "sha256": token_hash(t)} for role, t in self.tokens.items()]
        self.child = group.start("admin", [
            "admin", "--listen", f"{LOOPBACK}:{self.port}", "--database-url", database_url,
            "--coordinator", f"{LOOPBACK}:{self.admin_port}", "--log-level", "WARNING"], env={
            "FEDMASK_ADMIN_COORDINATOR__TOKEN": self._coordinator_token, "FEDMASK_ADMIN_TOKENS": json.dumps(tokens),
            "FEDMASK_ADMIN_LIMITS__HEAD_TIMEOUT_S": str(ADMIN_HEAD_TIMEOUT_S)})
        return self.child

    def ready(self, watch: list[Child]) -> None:
        """Wait until the service is ready, run every path once, take the RSS baseline."""
        import httpx

        def answers() -> bool:
            try:
                return httpx.get(self.base + "/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(answers, 60, what="the admin service ready", watch=watch, step=0.2)
        assert self.child is not None
        for role in self.honest:
            self._read(role, Honest())
            self._own_stream(role, Tally())
        send_until_answered(self.port, big_head(_HEAD, 1 * MiB))
        for chunked in (False, True):
            send_until_answered(self.port, with_body("POST", _ACTION, 1 * MiB, chunked=chunked))
            send_until_answered(self.port, with_body("GET", _HEAD, 1024, chunked=chunked))
        flood(self.port, self.limits.max_concurrent_requests)
        hog = [open_stream(self.port, self.tokens["hog"])[1] for _ in range(self.slots.per_token + 1)]
        for s in hog:
            s.close()
        samples = []
        for _ in range(6):
            time.sleep(0.05)
            samples.append(rss_mb(self.child.pid) or 0.0)
        self.baseline_mb = max(samples)

    # ---------------------------------------------------------------- threads

    def begin(self) -> None:
        """Start the attackers, the honest roles and the RSS sampler; they run until `finish`."""
        runs: list[Callable[[], None]] = [self._sample_rss, self._slow_heads, self._hog]
        runs += [self._paced(kind) for kind in ("oversized_head", "oversized_body", "body_to_bodiless",
                                                "concurrency_flood")]
        runs += [self._honest_loop(role) for role in self.honest]
        self._threads = [threading.Thread(target=r, daemon=True, name="admin-attack") for r in runs]
        for t in self._threads:
            t.start()

    def finish(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(GIVE_UP_S + 5)

    def _paced(self, kind: str) -> Callable[[], None]:
        def attempt(i: int) -> tuple[int | None, int]:
            if kind == "oversized_head":
                return send_until_answered(self.port, big_head(_HEAD, 64 * MiB))
            if kind == "oversized_body":
                return send_until_answered(self.port, with_body("POST", _ACTION, 200 * MiB, chunked=i % 2 == 1))
            if kind == "body_to_bodiless":
                return send_until_answered(self.port, with_body("GET", _HEAD, 1024, chunked=i % 2 == 1))
            return flood(self.port, self.limits.max_concurrent_requests), 0

        def run() -> None:
            tally = self.tallies[kind]
            for i in self._schedule():
                try:
                    tally.add(*attempt(i))
                except OSError:
                    tally.add(None)
        return run

    def _schedule(self) -> Iterator[int]:
        """0, 1, 2, ... at `rate` per second until stopped (late attempts are not made up in a burst)."""
        step, nxt, i = 1.0 / self.rate, time.monotonic(), 0
        while not self._stop.is_set():
            yield i
            i += 1
            nxt = max(nxt + step, time.monotonic() - step)
            self._stop.wait(max(0.0, nxt - time.monotonic()))

    def _slow_heads(self) -> None:
        heads = SlowHeads(self.port, self.tallies["slow_head"])
        step, nxt = 1.0 / self.rate, time.monotonic()
        end = None
        while end is None or (heads.live and time.monotonic() < end):
            if end is None and self._stop.is_set():
                end = time.monotonic() + ADMIN_HEAD_TIMEOUT_S + 3  # every head in flight gets its answer
            if end is None and time.monotonic() >= nxt:
                heads.open_one()
                nxt += step
            heads.tick()
            time.sleep(0.05)
        for s in list(heads.live):
            heads.end(s, None)

    def _hog(self) -> None:
        """One viewer token: its share of the streams held all along, one more asked for at `rate`."""
        tally = self.tallies["stream_hog"]
        held = []
        try:
            for _ in range(self.slots.per_token):
                status, s = open_stream(self.port, self.tokens["hog"])
                held.append(s)
                self.tallies.setdefault("stream_hog_held", Tally()).add(status)
            for _ in self._schedule():
                try:
                    status, s = open_stream(self.port, self.tokens["hog"])
                    s.close()
                except OSError:
                    status = None
                tally.add(status)
        finally:
            for s in held:
                s.close()

    def _honest_loop(self, role: str) -> Callable[[], None]:
        def run() -> None:
            import httpx

            honest = self.honest[role]
            next_stream = time.monotonic()
            with httpx.Client(timeout=READ_TIMEOUT_S) as client:
                while not self._stop.is_set():
                    self._read(role, honest, client)
                    if time.monotonic() >= next_stream and self.tallies["stream_hog"].attempts:
                        next_stream = time.monotonic() + 1.0  # once the hog holds its share
                        self._own_stream(role, honest.streams)
                    self._stop.wait(READ_EVERY_S)
        return run

    def _read(self, role: str, honest: Honest, client: Any = None) -> None:
        import httpx

        path = "/v1/rounds?limit=5" if role == "viewer" else "/v1/federation"
        t0 = time.monotonic()
        try:
            get = client.get if client is not None else httpx.get
            status = get(self.base + path, headers={"Authorization": f"Bearer {self.tokens[role]}"},
                         timeout=READ_TIMEOUT_S).status_code
        except httpx.HTTPError:
            status = 0
        honest.reads.append((status, time.monotonic() - t0))

    def _own_stream(self, role: str, tally: Tally) -> None:
        try:
            status, s = open_stream(self.port, self.tokens[role])
            s.close()
        except OSError:
            status = None
        tally.add(status)

    def _sample_rss(self) -> None:
        assert self.child is not None
        while not self._stop.wait(0.02):
            got = rss_mb(self.child.pid)
            if got is not None:
                self.rss.append(got)

    # ---------------------------------------------------------------- the figures

    def result(self) -> dict[str, Any]:
        grown = round(max(self.rss, default=self.baseline_mb) - self.baseline_mb, 1)
        kinds = {k: {"attempts": t.attempts, "answers": t.answers, "expected": [EXPECTED[k], *ALSO.get(k, ())],
                     "max_sent_mib": t.max_sent_mib} for k, t in self.tallies.items() if k in EXPECTED}
        held = self.tallies.get("stream_hog_held", Tally())
        refused = all(self.tallies[k].as_expected(EXPECTED[k], *ALSO.get(k, ())) for k in ADMIN_ATTACKS)
        honest_ok = all(h.ok() for h in self.honest.values())
        return {
            "ok": refused and grown <= MAX_RSS_GROWTH_MB and honest_ok and held.as_expected(200),
            "attacks": kinds,
            "hog_streams_held": held.answers,
            "rss_baseline_mb": round(self.baseline_mb, 1),
            "rss_growth_mb": grown,
            "honest": {role: h.result() for role, h in self.honest.items()},
            "limits": {"max_header_bytes": self.limits.max_header_bytes, "max_body_bytes": self.limits.max_body_bytes,
                       "max_concurrent_requests": self.limits.max_concurrent_requests,
                       "head_timeout_s": self.limits.head_timeout_s, "per_token_streams": self.slots.per_token},
        }


__all__ = ["ADMIN_ATTACKS", "AdminBench", "EXPECTED", "MAX_RSS_GROWTH_MB"]
