"""``add_numbers``: {"a": int, "b": int} -> {"sum": int}, plus ``"sum_text"`` (the exact sum as text) when
the sum is beyond ±2**53, which a Struct number (a double) cannot carry exactly.

The control plane refuses inputs beyond ±2**53 for the same reason; the runner itself adds integers of
any size (``python -m runner``).
"""

from __future__ import annotations

from typing import Any

from corral.jobtypes import BUILTIN_SCHEMAS
from runner.payload import as_int, exact_int
from runner.registry import JobContext, JobType, register


@register
class AddNumbers(JobType):
    """Add two integers."""

    name = "add_numbers"
    schema = BUILTIN_SCHEMAS["add_numbers"]

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Return ``{"sum": a + b}`` (see the module docstring); integral floats (from a protobuf Struct)
        count as integers."""
        return exact_int("sum", as_int(payload["a"], "a") + as_int(payload["b"], "b"))
