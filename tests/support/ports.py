"""Ports of 127.0.0.1 for tests: a free one to bind, and an address that refuses connections."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dead_address() -> str:
    """A 127.0.0.1 address nothing listens on (its port was free a moment ago), so connecting is refused."""
    return f"127.0.0.1:{free_port()}"
