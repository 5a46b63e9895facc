"""``sleep``: {"seconds": s} -> {"slept": s}. Holds a slot for a while (timeouts, drains, load)."""

from __future__ import annotations

import time
from typing import Any

from corral.jobtypes import BUILTIN_SCHEMAS
from runner.registry import JobContext, JobType, register


@register
class Sleep(JobType):
    """Sleep for ``seconds`` and report how long."""

    name = "sleep"
    schema = BUILTIN_SCHEMAS["sleep"]

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Sleep ``payload["seconds"]`` seconds."""
        seconds = payload["seconds"]
        time.sleep(seconds)
        return {"slept": seconds}
