"""Ports of 127.0.0.1 for tests: a free one to bind, an address that refuses connections, and one
that accepts them and never answers (:func:`silent_listener`).

A port picked for a process to bind later (a control plane's fixed ports, so that a standby or a
restart finds it at the same address) is taken below the kernel's ephemeral range. A port from that
range (what binding port 0 gives) can be handed out again meanwhile as the source port of any
outgoing connection, a database client's say, and the later bind then fails with "Address already
in use": a CI run lost a standby's HTTP port that way. Below the range, only a process that binds
that very port can take it.

When the tests run in several processes (pytest-xdist), each picks from a part of the range of its own,
so that two of them never hand out the same port.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

LOWEST = 20_000
"""Where the ports picked here start."""
_handed_out: set[int] = set()


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (Linux's default when it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _my_part(lowest: int, top: int) -> tuple[int, int]:
    """This test process's part of ``[lowest, top)``: all of it unless pytest-xdist runs several."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 1):
        return lowest, top
    width = (top - lowest) // int(count)
    start = lowest + int(worker[2:]) * width
    return start, start + width


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago, below the ephemeral range (see the module
    docstring), and not handed out before by this process or by another running these tests."""
    low, top = _my_part(LOWEST, _ephemeral_start())
    for _ in range(200):
        if top <= low:
            break
        port = random.randrange(low, top)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:  # a machine whose ephemeral range starts low: any free port
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dead_address() -> str:
    """A 127.0.0.1 address nothing listens on (its port was free a moment ago), so connecting is refused."""
    return f"127.0.0.1:{free_port()}"


@contextlib.contextmanager
def silent_listener() -> Iterator[str]:
    """A 127.0.0.1 address that accepts connections and never says a word (no HTTP/2 handshake)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:  # the timeout, or the listener closed
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(5)
    listener.close()
    for conn in accepted:
        conn.close()
