"""A job-type plug-in whose schema the control plane refuses: a ``minimum`` that is not a number."""

from __future__ import annotations

from typing import Any

from runner.registry import JobContext, JobType, register


@register
class BadMinimum(JobType):
    """Declares a schema whose minimum is a string."""

    name = "bad_minimum"
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": "x"}}}

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Never runs: the plug-in is refused as it is imported."""
        return {}
