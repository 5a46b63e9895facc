"""A job type for drain tests (load with ``--import tests.fault.held_jobs``).

* ``held_record`` {"path", "hold"}: appends ``"<job_id> <attempt>\\n"`` to ``path``, as ``record`` does
  (``tests.support.calls.executions`` reads it), then waits until the file ``hold`` exists and returns:
  a test decides when the job ends, e.g. only once the control plane is down.
"""

from __future__ import annotations

import os
import time
from typing import Any

from runner.registry import JobContext, JobType, register


@register
class HeldRecord(JobType):
    """Record this execution, then wait for the test to let the job end."""

    name = "held_record"
    schema = {
        "type": "object",
        "properties": {"path": {"type": "string", "minLength": 1}, "hold": {"type": "string", "minLength": 1}},
        "required": ["path", "hold"],
        "additionalProperties": False,
    }

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Record, then wait (without a deadline of its own: the job's timeout bounds it) for ``hold``."""
        fd = os.open(payload["path"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{ctx.job_id} {ctx.attempt}\n".encode())
        finally:
            os.close(fd)
        while not os.path.exists(payload["hold"]):
            time.sleep(0.01)
        return {"job_id": ctx.job_id, "attempt": ctx.attempt}
