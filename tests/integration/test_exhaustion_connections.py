"""Connections that never finish their handshake are closed: a client cannot hold the control plane's
file descriptors with TCP connections that say nothing.

Before, 20,000 such connections were all held (gRPC's default handshake timeout is 120 s, and it
started again for each new one), up to the process's descriptor limit, and a worker that had to
reconnect then could not."""

from __future__ import annotations

import socket
import time

import pytest

from control.api import HANDSHAKE_TIMEOUT_SEC
from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, wait_until

SILENT = 20


def _closed(sock: socket.socket) -> bool:
    """Whether the peer closed ``sock`` (read without waiting)."""
    try:
        return sock.recv(1 << 16, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


@pytest.mark.slow
def test_connections_that_never_finish_their_handshake_are_closed(control_plane: ControlProc) -> None:
    # Given connections to the gRPC port that send nothing at all
    socks = [socket.create_connection(("127.0.0.1", control_plane.port)) for _ in range(SILENT)]
    opened = time.monotonic()
    try:
        # Then the control plane closes each of them once the handshake timeout has passed
        wait_until(
            lambda: all(_closed(s) for s in socks), HANDSHAKE_TIMEOUT_SEC + 10, 0.2, "the silent connections closed"
        )
        assert time.monotonic() - opened >= HANDSHAKE_TIMEOUT_SEC - 1  # not before: a slow TLS client gets its time
        # and it goes on serving
        assert control_plane.jobs.GetStats(jobs_pb2.GetStatsRequest(), timeout=10) is not None
    finally:
        for s in socks:
            s.close()
