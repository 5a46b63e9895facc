"""gRPC transport defaults that every Corral process (and client) gets by importing ``corral``.

gRPC's core reads ``GRPC_EXPERIMENTS`` once, when ``grpc`` is first imported, so the default is set
by the first module of this package that loads, before any of them imports ``grpc``: the
``corral``, ``control`` and ``worker`` packages all import this module first.

The default turns off three gRPC experiments that route every read and write through the
EventEngine's own threads (``event_engine_client``, ``event_engine_listener``,
``event_engine_callback_cq``). On a small machine each extra thread hop is a wake-up on a busy
core: with them off, a bidirectional-stream message pair between two bare ``grpc.aio`` processes
took about a third less time and a quarter less CPU, and with ``python -m bench`` (runs alternated)
submit-to-SUCCEEDED p50 fell by about a fifth and jobs/s rose by about a twentieth. The code paths used instead are gRPC's long-standing polling
engine, which the same release still ships and tests.

With the EventEngine client off, nothing services an idle blocking (non-asyncio) channel but gRPC's
backup poller, every 5 s by default. A control plane stopping gracefully waits for each connected
client to answer its GOAWAY, so one idle ``corral.Client`` (a long-lived program, a dashboard) held
every restart for up to 5 s: ``GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS`` is set to
:data:`BACKUP_POLL_MS` along with the experiments (measured: a stop with an idle client took 3.3-4.5 s
at gRPC's 5,000 ms, 0.57 s at 1,000 ms, 0.17 s at 200 ms). The cost is that many wake-ups a second
in an idle client process.

A ``GRPC_EXPERIMENTS`` already in the environment wins, even an empty one (``GRPC_EXPERIMENTS=``
keeps gRPC's own defaults), and then the poll interval is left alone too; one set alone wins over ours. Importing ``grpc`` before ``corral`` also keeps gRPC's defaults, and so
does a grpcio release these settings were not measured on (:data:`MEASURED_ON`): a later release may
have dropped those experiments, and gRPC logs an error for each unknown name.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
from pathlib import Path

GRPC_EXPERIMENTS = "-event_engine_client,-event_engine_listener,-event_engine_callback_cq"
"""The experiments Corral turns off (see the module docstring)."""
BACKUP_POLL_MS = "200"
"""gRPC's backup poll interval for idle channels, set with the experiments (see the module docstring)."""
MEASURED_ON = ("1.85.",)
"""grpcio releases (prefixes) on which the setting was measured; other releases keep gRPC's defaults."""


def host_port(host: str, port: int) -> str:
    """``host:port`` as gRPC and URLs take it: an IPv6 literal in brackets (``[::1]:50051``)."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def loopback(host: str) -> str:
    """The host that reaches, from this machine, a server bound to ``host`` (a wildcard: loopback)."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host in ("::", "[::]"):
        return "::1"
    return host


def keepalive(every_sec: float, timeout_sec: float) -> list[tuple[str, int]]:
    """Channel options that ping the server every ``every_sec`` while a call is open and end the
    connection when a ping is not answered within ``timeout_sec`` (the call fails ``UNAVAILABLE``).

    Without them a connection that goes silent with no FIN or RST (a partition, a server host that
    lost power, a load balancer that forgot the flow) is noticed only when TCP gives up on data sent,
    after many minutes, and never by a call that only listens (a watch). The control plane accepts a
    ping a second (``control.api.create_server``).
    """
    every_ms, timeout_ms = int(every_sec * 1000), int(timeout_sec * 1000)
    return [
        ("grpc.keepalive_time_ms", every_ms),
        ("grpc.keepalive_timeout_ms", timeout_ms),
        ("grpc.http2.ping_timeout_ms", timeout_ms),  # what grpcio 1.85 waits for the ack by
        ("grpc.http2.max_pings_without_data", 0),  # a call that only listens sends no data, and must still ping
    ]


_VERSION_LINE = re.compile(r"""__version__\s*=\s*(['"]+)([^'"]+)\1""")


def _grpcio_version() -> str:
    """The installed grpcio's release, without importing ``grpc`` (that would read GRPC_EXPERIMENTS
    before it is set).

    grpcio keeps it in ``grpc/_grpcio_metadata.py``, a file read in a fraction of a millisecond.
    ``importlib.metadata`` (the fallback) scans every installed distribution and imports modules a
    client does not otherwise need: ``import corral.client`` took about 20 ms longer with it (140
    against 120 ms on this machine), at the start of every CLI command and client program."""
    spec = importlib.util.find_spec("grpc")  # a top-level package: found, not imported
    if spec is not None and spec.origin:
        with contextlib.suppress(OSError):
            text = (Path(spec.origin).parent / "_grpcio_metadata.py").read_text(encoding="utf-8")
            if found := _VERSION_LINE.search(text):
                return found.group(2)
    from importlib import metadata

    try:
        return metadata.version("grpcio")
    except metadata.PackageNotFoundError:
        return ""


def apply_defaults() -> bool:
    """Set ``GRPC_EXPERIMENTS`` (and the backup poll interval, unless that is set) unless it is set,
    ``grpc`` is already loaded or its release was not measured; True if it was set now."""
    if "GRPC_EXPERIMENTS" in os.environ or "grpc" in sys.modules:
        return False
    if not _grpcio_version().startswith(MEASURED_ON):
        return False
    os.environ["GRPC_EXPERIMENTS"] = GRPC_EXPERIMENTS
    os.environ.setdefault("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", BACKUP_POLL_MS)
    return True


apply_defaults()
