"""``reverse_string``: {"text": str} -> {"reversed": str}, reversed by code point.

Python strings are sequences of code points, so a character outside the BMP (an emoji) stays one
unit and is never split into surrogate halves. Combining sequences are reversed code point by code
point, as the contract says.
"""

from __future__ import annotations

from typing import Any

from corral.jobtypes import BUILTIN_SCHEMAS
from runner.errors import JobFailed
from runner.registry import JobContext, JobType, register


@register
class ReverseString(JobType):
    """Reverse a string by code point."""

    name = "reverse_string"
    schema = BUILTIN_SCHEMAS["reverse_string"]

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Return ``{"reversed": text[::-1]}``."""
        text = payload["text"]
        if not isinstance(text, str):
            raise JobFailed("INVALID_PAYLOAD", f"text: {type(text).__name__} is not a string")
        return {"reversed": text[::-1]}
