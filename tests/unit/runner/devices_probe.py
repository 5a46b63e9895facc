"""A job type that reports the GPUs it was shown (load with ``--import tests.unit.runner.devices_probe``).

* ``visible_devices`` {"gate"?: path}: waits (up to 30 s) until ``gate`` exists, when given, so that a
  test can hold several attempts running at once; then returns ``{"devices": CUDA_VISIBLE_DEVICES or
  null when unset, "pid": the runner's pid}``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from runner.errors import JobFailed
from runner.registry import JobContext, JobType, register

GATE_TIMEOUT_SEC = 30.0


@register
class VisibleDevices(JobType):
    """Report CUDA_VISIBLE_DEVICES and the runner's pid, once ``gate`` exists."""

    name = "visible_devices"
    schema = {
        "type": "object",
        "properties": {"gate": {"type": "string", "minLength": 1}},
        "additionalProperties": False,
    }

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Wait for the gate (a condition with a deadline), then say what this job sees."""
        gate = payload.get("gate")
        deadline = time.monotonic() + GATE_TIMEOUT_SEC
        while gate is not None and not os.path.exists(gate):
            if time.monotonic() > deadline:
                raise JobFailed("GATE", f"{gate} did not appear within {GATE_TIMEOUT_SEC} s")
            time.sleep(0.002)
        return {"devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid()}
