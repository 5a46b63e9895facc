"""The asyncio event loop Corral's long-running processes (control plane, worker agent) run on.

``uvloop`` (libuv under asyncio's interface) by default: every job passes through several event-loop
turns in the control plane and in a worker (a stream message in, a commit, a message out, a runner
process's pipe), and uvloop's turns are cheaper. Measured with the benchmarks, runs alternated with
and without it: submit-to-SUCCEEDED p50 about a sixth lower and about a tenth more jobs per second.
``CORRAL_EVENT_LOOP=asyncio`` picks the standard library's loop; so does a platform without uvloop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

LOOPS = ("uvloop", "asyncio")
"""The values of CORRAL_EVENT_LOOP."""


def loop_factory(kind: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """A factory of ``kind`` loops; None means asyncio's own (asked for, or uvloop is not installed)."""
    if kind == "uvloop":
        try:
            import uvloop
        except ImportError:
            return None
        return uvloop.new_event_loop  # type: ignore[no-any-return]
    return None


def run(main: Coroutine[Any, Any, T], kind: str = "uvloop") -> T:
    """``asyncio.run(main)`` on a loop of ``kind`` (see :data:`LOOPS`)."""
    with asyncio.Runner(loop_factory=loop_factory(kind)) as runner:
        return runner.run(main)
