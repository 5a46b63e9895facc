"""Payload checks: schema validation (``python -m runner``) and reading numbers that travelled as JSON.

Payloads reach a job as parsed JSON. When they crossed a ``google.protobuf.Struct`` on the way every
number became a float, so ``3`` arrives as ``3.0``: :func:`as_int` takes either and gives back an exact
``int``. Schema validation is for entry points that take payloads from people; the worker pool does not
validate again, because the control plane refused bad payloads at submit time.
"""

from __future__ import annotations

from typing import Any

from corral.jobtypes import MAX_EXACT_INTEGER
from runner.errors import JobFailed
from runner.registry import JobType

__all__ = ["as_int", "exact_int", "validate"]


def as_int(value: object, field: str) -> int:
    """``value`` as an exact int: ints pass, integral floats convert, anything else is refused.

    Raises:
        JobFailed: code ``INVALID_PAYLOAD`` naming ``field``, for booleans, fractions, NaN, infinity
            and non-numbers.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise JobFailed("INVALID_PAYLOAD", f"{field}: {value!r} is not an integer")


def exact_int(key: str, value: int) -> dict[str, Any]:
    """``{key: value}``, plus ``{key}_text: str(value)`` when ``value`` is beyond ±2**53: the result
    travels in a Struct, whose numbers are doubles, so only the text is exact there."""
    if abs(value) <= MAX_EXACT_INTEGER:
        return {key: value}
    return {key: value, f"{key}_text": str(value)}


def validate(job_type: JobType, payload: Any) -> None:
    """Check ``payload`` against ``job_type.schema`` (JSON Schema draft 2020-12).

    Raises:
        JobFailed: code ``INVALID_PAYLOAD``, message ``"payload.<field>: <rule>"`` for the most relevant
            error (the field is the dotted path; for a missing property it is that property).
    """
    import jsonschema  # imported here: only the command line validates, and the import is slow

    validator = jsonschema.Draft202012Validator(job_type.schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(payload))
    if error is None:
        return
    path = [str(part) for part in error.absolute_path]
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [name for name in error.validator_value if name not in error.instance]
        if missing:
            path.append(str(missing[0]))
            raise JobFailed("INVALID_PAYLOAD", f"{_field(path)}: is required")
    if error.validator == "additionalProperties" and not path and isinstance(error.instance, dict):
        allowed = set(job_type.schema.get("properties", {}))
        extra = sorted(str(name) for name in error.instance if name not in allowed)
        if extra:
            path.append(extra[0])
            raise JobFailed("INVALID_PAYLOAD", f"{_field(path)}: is not allowed")
    raise JobFailed("INVALID_PAYLOAD", f"{_field(path)}: {error.message}")


def _field(path: list[str]) -> str:
    return ".".join(["payload", *path])
