"""``large_array_sum``: {"numbers": [int, ...]} -> {"sum": int}, the exact sum (no int64 overflow)."""

from __future__ import annotations

from typing import Any

from corral.jobtypes import BUILTIN_SCHEMAS
from runner.errors import JobFailed
from runner.kernels.array_sum import array_sum
from runner.payload import as_int
from runner.registry import JobContext, JobType, register


@register
class LargeArraySum(JobType):
    """Sum a list of integers exactly."""

    name = "large_array_sum"
    schema = BUILTIN_SCHEMAS["large_array_sum"]

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Return ``{"sum": sum(numbers)}``; an empty list sums to 0."""
        numbers = payload["numbers"]
        if not isinstance(numbers, list):
            raise JobFailed("INVALID_PAYLOAD", f"numbers: {type(numbers).__name__} is not an array")
        if not all(type(n) is int for n in numbers):
            numbers = [as_int(n, f"numbers.{i}") for i, n in enumerate(numbers)]
        return {"sum": array_sum(numbers, threads=ctx.threads)}
