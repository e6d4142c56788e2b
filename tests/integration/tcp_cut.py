"""A TCP forwarder a test can cut: the network path between one process
and a server, on 127.0.0.1, without root or a network namespace.

    with TcpForwarder(("127.0.0.1", pg_port)) as path:
        ... the process connects to path.port ...
        path.cut()   # every forwarded connection is reset, new ones refused

Contract of `cut()`: when it returns, the listening socket is closed (a new
connection to `port` is refused: nothing else listens there, the port was
the forwarder's own) and every connection it forwarded is closed with a
reset (SO_LINGER 0) on both sides, so a client blocked in a read gets an
error at once instead of waiting on TCP timeouts. `cut()` is final.

`silence()` is the other kind of cut, a network that drops packets: every
connection stays open and new ones are accepted, but no byte passes any
more in either direction, so a client blocked in a read waits until its
own timeouts give up. `cut()` after `silence()` resets them all.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from types import TracebackType

_RESET_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST


class TcpForwarder:
    """Forwards every connection to 127.0.0.1:`port` to `upstream` (see the module doc)."""

    def __init__(self, upstream: tuple[str, int], host: str = "127.0.0.1") -> None:
        self.upstream = upstream
        self._listener = socket.create_server((host, 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._cut = False
        self._silent = threading.Event()
        self.forwarded = 0
        self._acceptor = threading.Thread(target=self._accept, name="tcp-cut-accept", daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self._listener.accept()
            except OSError:  # the listener was closed: cut
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                downstream.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._cut:
                    _reset(downstream)
                    _reset(upstream)
                    return
                self._sockets.update((downstream, upstream))
                self.forwarded += 1
            for src, dst in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pump, args=(src, dst), name="tcp-cut-pump", daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if not self._silent.is_set():
                    dst.sendall(data)
        except OSError:
            pass
        if not self._silent.is_set():  # a silent network passes no end of stream either
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def silence(self) -> None:
        """Pass no byte any more, on every connection, old or new; close none."""
        self._silent.set()

    def cut(self) -> None:
        """Refuse new connections and reset every forwarded one."""
        with self._lock:
            self._cut = True
            sockets, self._sockets = self._sockets, set()
        with contextlib.suppress(OSError):  # wakes the acceptor's accept() at once (close alone does not)
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for s in sockets:
            _reset(s)
        self._acceptor.join(timeout=5)

    def __enter__(self) -> TcpForwarder:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.cut()


def _reset(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    s.close()
