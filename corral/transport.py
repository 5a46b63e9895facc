"""gRPC transport defaults that every Corral process (and client) gets by importing ``corral``.

gRPC's core reads ``GRPC_EXPERIMENTS`` once, when ``grpc`` is first imported, so the default is set
by the first module of this package that loads, before any of them imports ``grpc``: the
``corral``, ``control`` and ``worker`` packages all import this module first.

The default turns off three gRPC experiments that route every read and write through the
EventEngine's own threads (``event_engine_client``, ``event_engine_listener``,
``event_engine_callback_cq``). On a small machine each extra thread hop is a wake-up on a busy
core: with them off, a bidirectional-stream message pair between two ``grpc.aio`` processes took
about a third less time and a quarter less CPU (``python -m bench transport``), and end-to-end
throughput rose by about a fifth. The code paths used instead are gRPC's long-standing polling
engine, which the same release still ships and tests.

A ``GRPC_EXPERIMENTS`` already in the environment wins, even an empty one (``GRPC_EXPERIMENTS=``
keeps gRPC's own defaults). Importing ``grpc`` before ``corral`` also keeps gRPC's defaults.
"""

from __future__ import annotations

import os
import sys

GRPC_EXPERIMENTS = "-event_engine_client,-event_engine_listener,-event_engine_callback_cq"
"""The experiments Corral turns off (see the module docstring)."""


def apply_defaults() -> bool:
    """Set ``GRPC_EXPERIMENTS`` unless it is set or ``grpc`` is already loaded; True if it was set now."""
    if "GRPC_EXPERIMENTS" in os.environ or "grpc" in sys.modules:
        return False
    os.environ["GRPC_EXPERIMENTS"] = GRPC_EXPERIMENTS
    return True


APPLIED = apply_defaults()
"""Whether importing this module set ``GRPC_EXPERIMENTS`` (False: it was set already, or grpc was loaded)."""


def active() -> bool:
    """Whether this process runs with Corral's experiment settings."""
    return os.environ.get("GRPC_EXPERIMENTS") == GRPC_EXPERIMENTS
