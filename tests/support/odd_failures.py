"""A job type that raises JobFailed with a code and a message that are not text (load with ``--import
tests.support.odd_failures``).

* ``odd_failure`` {"how"}: ``"int_code"`` raises with code 123 and message "plain"; ``"object_message"``
  sets the message to an object; ``"unshowable"`` to an object whose ``__str__`` raises; anything else
  returns ``{"pid": <its runner's pid>}``.
"""

from __future__ import annotations

import os
from typing import Any

from runner.errors import JobFailed
from runner.registry import JobContext, JobType, register


class _Shown:
    def __str__(self) -> str:
        return "shown object"


class _Unshowable:
    def __str__(self) -> str:
        raise RuntimeError("no str")


@register
class OddFailure(JobType):
    """Fail with a code or message that is not a string."""

    name = "odd_failure"
    schema = {"type": "object"}

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """See the module docstring."""
        how = payload.get("how")
        if how == "int_code":
            raise JobFailed(123, "plain")  # type: ignore[arg-type]
        if how in ("object_message", "unshowable"):
            exc = JobFailed("ODD", "x")
            exc.message = _Shown() if how == "object_message" else _Unshowable()  # type: ignore[assignment]
            raise exc
        return {"pid": os.getpid()}
