"""The rules for job ids a request names, shared by the control plane and the clients (which check a
list before sending it)."""

from __future__ import annotations

from collections.abc import Iterable

from corral.errors import InvalidArgument

__all__ = ["MAX_ID", "MAX_WATCHED_JOBS", "check_id", "watched_ids"]

MAX_ID = 128
"""The longest job or worker id a request may name (ids made here are 32 characters; worker ids 1..128)."""
MAX_WATCHED_JOBS = 10_000
"""Jobs one WatchJobs stream may follow, and one CancelJobs call may name."""


def check_id(value: object, field: str) -> str:
    """``value`` as an id named by ``field``.

    Raises:
        InvalidArgument: on ``field`` unless ``value`` is a string of 1 to MAX_ID characters.
    """
    if not isinstance(value, str):
        raise InvalidArgument(field, f"must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidArgument(field, "is required")
    if len(value) > MAX_ID:
        raise InvalidArgument(field, f"must be at most {MAX_ID} characters, got {len(value)}")
    return value


def watched_ids(ids: Iterable[object]) -> list[str]:
    """The ids of a WatchJobs or CancelJobs request: 1 to MAX_WATCHED_JOBS, each an id (:func:`check_id`)
    at most once.

    Raises:
        InvalidArgument: naming ``ids`` or the entry ``ids[k]`` that breaks a rule.
    """
    if isinstance(ids, str | bytes):  # a lone id would be taken as its characters
        raise InvalidArgument("ids", f"must be a list of job ids, got {type(ids).__name__}")
    out = list(ids)
    if not 1 <= len(out) <= MAX_WATCHED_JOBS:
        raise InvalidArgument("ids", f"must hold 1 to {MAX_WATCHED_JOBS:,} job ids, got {len(out):,}")
    seen: dict[str, int] = {}
    for k, value in enumerate(out):
        job_id = check_id(value, f"ids[{k}]")
        if (first := seen.setdefault(job_id, k)) != k:
            raise InvalidArgument(f"ids[{k}]", f"repeats ids[{first}] ({job_id!r}): name each job once")
    return list(seen)
