"""A job-type plug-in that starts a helper process as it is imported, shared by all its jobs (a local
server, a model host): ``helper_pid`` returns the runner's pid and the helper's (for the worker tests)."""

from __future__ import annotations

import os
import subprocess
from typing import Any

from runner.registry import JobContext, JobType, register

HELPER = subprocess.Popen(["sleep", "600"])


@register
class HelperPid(JobType):
    """Return the runner's pid and its import-time helper's."""

    name = "helper_pid"
    schema = {"type": "object", "additionalProperties": False}

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """See the module docstring."""
        return {"runner": os.getpid(), "helper": HELPER.pid}
