"""``noop``: {} -> {}. The cheapest job there is; benchmarks measure scheduling overhead with it."""

from __future__ import annotations

from typing import Any

from corral.jobtypes import BUILTIN_SCHEMAS
from runner.registry import JobContext, JobType, register


@register
class Noop(JobType):
    """Do nothing and return an empty object."""

    name = "noop"
    schema = BUILTIN_SCHEMAS["noop"]

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Return ``{}``."""
        return {}
