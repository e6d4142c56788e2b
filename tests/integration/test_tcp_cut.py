"""The tests' TCP forwarder (tcp_cut.py): what its cut promises, since the
cut-off tests time a replica's reaction from the moment of the cut."""

from __future__ import annotations

import socket
import time

import pytest

from tcp_cut import TcpForwarder


def test_a_cut_resets_every_forwarded_connection_and_refuses_new_ones_at_once() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        path = TcpForwarder(("127.0.0.1", server.getsockname()[1]))
        client = socket.create_connection(("127.0.0.1", path.port), timeout=5)
        upstream, _ = server.accept()
        client.sendall(b"ping")
        assert upstream.recv(4) == b"ping"
        t0 = time.monotonic()
        path.cut()
        assert time.monotonic() - t0 < 1.0  # the acceptor is woken, not waited out
        with pytest.raises(OSError):  # reset (or already closed): no byte passes any more
            client.sendall(b"x" * 65536)
            if not client.recv(1):
                raise ConnectionResetError("closed")
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", path.port), timeout=1)
        client.close()
        upstream.close()
