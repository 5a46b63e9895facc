"""What a client submits: :class:`JobSpec`, and its conversion to a ``SubmitJobRequest``.

``Client.submit`` takes the same fields as keyword arguments and builds a :class:`JobSpec`;
``Client.submit_many`` takes a sequence of them and sends one ``SubmitJobs`` batch.
Unset optional fields (``thread_demand``, ``timeout_sec``, ``max_attempts``) are left out of the request
so that the control plane applies its defaults.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from google.protobuf import timestamp_pb2

from corral.errors import InvalidArgument
from corral.job import dict_to_struct
from corral.v1 import jobs_pb2

__all__ = ["JobSpec", "When", "to_timestamp"]

When = datetime | float
"""A point in time: an aware ``datetime`` (naive means UTC) or Unix seconds."""


@dataclass(frozen=True)
class JobSpec:
    """One job to submit; the control plane validates every field (the rules are in ``jobs.proto``)."""

    type: str
    payload: Mapping[str, Any] | None = None
    """A JSON object; must satisfy the job type's schema (see ``corral.jobtypes``)."""
    name: str = ""
    priority: int = 0
    """0..100, higher runs first."""
    thread_demand: int | None = None
    """Threads the job wants (1..1024); the server's default is 1."""
    timeout_sec: float | None = None
    """Per-attempt deadline in seconds; the server's default applies when ``None``."""
    max_attempts: int | None = None
    """Attempts before the job is FAILED (1..100); the server's default is 3."""
    scheduled_at: When | None = None
    """Do not start before this time."""
    idempotency_key: str = ""
    """The same key with the same request returns the original job instead of a new one."""
    labels: Mapping[str, str] | None = None

    def to_proto(self) -> jobs_pb2.SubmitJobRequest:
        """Build the ``SubmitJobRequest`` for this spec."""
        request = jobs_pb2.SubmitJobRequest(
            name=self.name,
            type=self.type,
            payload=dict_to_struct(self.payload),
            priority=self.priority,
            idempotency_key=self.idempotency_key,
            labels=dict(self.labels or {}),
        )
        if self.thread_demand is not None:
            request.thread_demand = self.thread_demand
        if self.timeout_sec is not None:
            request.timeout_sec = self.timeout_sec
        if self.max_attempts is not None:
            request.max_attempts = self.max_attempts
        if self.scheduled_at is not None:
            request.scheduled_at.CopyFrom(to_timestamp(self.scheduled_at, "scheduled_at"))
        return request


def to_timestamp(when: When, what: str = "time") -> timestamp_pb2.Timestamp:
    """Convert a ``datetime`` (naive means UTC) or Unix seconds to a ``Timestamp``."""
    ts = timestamp_pb2.Timestamp()
    if isinstance(when, datetime):
        ts.FromDatetime(when if when.tzinfo else when.replace(tzinfo=UTC))
    elif isinstance(when, int | float) and not isinstance(when, bool) and math.isfinite(when):
        whole = math.floor(when)  # split first: a double holds Unix nanoseconds only to ~100 ns
        ts.FromNanoseconds(whole * 1_000_000_000 + round((when - whole) * 1e9))
    else:
        raise InvalidArgument(what, f"must be a datetime or Unix seconds, got {when!r}")
    return ts
