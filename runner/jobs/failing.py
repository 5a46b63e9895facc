"""``failing``: fails on purpose, to exercise retries and the dead-letter queue.

Payload ``{"message": str, "fail_attempts": k}``: attempts 1..k fail with ``JobFailed("ERROR",
message)`` and attempt k+1 returns ``{"attempt": k+1}``. Without ``fail_attempts`` every attempt fails.
"""

from __future__ import annotations

from typing import Any

from corral.jobtypes import BUILTIN_SCHEMAS
from runner.errors import JobFailed
from runner.payload import as_int
from runner.registry import JobContext, JobType, register

DEFAULT_MESSAGE = "failing on purpose"
"""The error message when the payload gives none."""


@register
class Failing(JobType):
    """Fail the first ``fail_attempts`` attempts (all of them by default), then succeed."""

    name = "failing"
    schema = BUILTIN_SCHEMAS["failing"]

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Raise ``JobFailed("ERROR", message)`` while ``ctx.attempt <= fail_attempts``."""
        message = str(payload.get("message", DEFAULT_MESSAGE))
        limit = payload.get("fail_attempts")
        if limit is None or ctx.attempt <= as_int(limit, "fail_attempts"):
            raise JobFailed("ERROR", message)
        return {"attempt": ctx.attempt}
