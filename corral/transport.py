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

A ``GRPC_EXPERIMENTS`` already in the environment wins, even an empty one (``GRPC_EXPERIMENTS=``
keeps gRPC's own defaults). Importing ``grpc`` before ``corral`` also keeps gRPC's defaults, and so
does a grpcio release these settings were not measured on (:data:`MEASURED_ON`): a later release may
have dropped those experiments, and gRPC logs an error for each unknown name.
"""

from __future__ import annotations

import os
import sys
from importlib import metadata

GRPC_EXPERIMENTS = "-event_engine_client,-event_engine_listener,-event_engine_callback_cq"
"""The experiments Corral turns off (see the module docstring)."""
MEASURED_ON = ("1.85.",)
"""grpcio releases (prefixes) on which the setting was measured; other releases keep gRPC's defaults."""


def _grpcio_version() -> str:
    try:
        return metadata.version("grpcio")
    except metadata.PackageNotFoundError:
        return ""


def apply_defaults() -> bool:
    """Set ``GRPC_EXPERIMENTS`` unless it is set, ``grpc`` is already loaded or its release was not
    measured; True if it was set now."""
    if "GRPC_EXPERIMENTS" in os.environ or "grpc" in sys.modules:
        return False
    if not _grpcio_version().startswith(MEASURED_ON):
        return False
    os.environ["GRPC_EXPERIMENTS"] = GRPC_EXPERIMENTS
    return True


apply_defaults()
