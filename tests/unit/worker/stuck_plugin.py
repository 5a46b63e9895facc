"""A job-type plug-in for runners that get stuck (load with ``--import tests.unit.worker.stuck_plugin``).

* At import: when ``CORRAL_TEST_STALL_FILE`` names a file that exists, the import sleeps the number of
  seconds written in it, so that a test can let the first runners start at once and make their
  replacements slow to start, or never ready (a plug-in that stopped importing); when it says
  ``crash``, the import exits at once (a replacement that dies as it starts).
* ``leave_thread`` {"seconds"}: starts a non-daemon thread that sleeps ``seconds``, and returns at once
  ``{"pid": the runner's pid}``; the runner's ``sys.exit`` then waits for that thread.
* ``hang_at_exit`` {"seconds"}: registers an exit handler that sleeps ``seconds``, and returns at once
  ``{"pid": the runner's pid}``. It leaves nothing running, so the runner takes more jobs, and hangs
  only when it exits.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from pathlib import Path
from typing import Any

from runner.registry import JobContext, JobType, register

STALL_FILE_ENV = "CORRAL_TEST_STALL_FILE"

_stall = os.environ.get(STALL_FILE_ENV)
if _stall and Path(_stall).exists():
    if Path(_stall).read_text() == "crash":
        os._exit(3)  # a plug-in that now dies as it imports
    time.sleep(float(Path(_stall).read_text()))  # the slow (or endless) import itself


@register
class LeaveThread(JobType):
    """Leave a non-daemon thread sleeping behind, and return the runner's pid."""

    name = "leave_thread"
    schema = {
        "type": "object",
        "properties": {"seconds": {"type": "number", "minimum": 0, "maximum": 86400}},
        "required": ["seconds"],
        "additionalProperties": False,
    }

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Start the thread, and return without waiting for it."""
        threading.Thread(target=time.sleep, args=(float(payload["seconds"]),), name="left-behind").start()
        return {"pid": os.getpid()}


@register
class HangAtExit(JobType):
    """Make the runner's exit hang, and return the runner's pid."""

    name = "hang_at_exit"
    schema = LeaveThread.schema

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Register the exit handler, and return."""
        atexit.register(time.sleep, float(payload["seconds"]))
        return {"pid": os.getpid()}
