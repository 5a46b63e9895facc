"""A job-type plug-in whose schema the control plane refuses: a ``pattern`` that is not a regex."""

from __future__ import annotations

from typing import Any

from runner.registry import JobContext, JobType, register


@register
class BadPattern(JobType):
    """Declares a schema with an unclosed group in a pattern."""

    name = "bad_pattern"
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(unclosed"}}}

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Never runs: the plug-in is refused as it is imported."""
        return {}
