"""``add_numbers``: {"a": int, "b": int} -> {"sum": int}, exact for any size of integer."""

from __future__ import annotations

from typing import Any

from corral.jobtypes import BUILTIN_SCHEMAS
from runner.payload import as_int
from runner.registry import JobContext, JobType, register


@register
class AddNumbers(JobType):
    """Add two integers."""

    name = "add_numbers"
    schema = BUILTIN_SCHEMAS["add_numbers"]

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Return ``{"sum": a + b}``; integral floats (from a protobuf Struct) count as integers."""
        return {"sum": as_int(payload["a"], "a") + as_int(payload["b"], "b")}
