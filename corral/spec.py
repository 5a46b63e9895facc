"""What a client submits: :class:`JobSpec`, and its conversion to a ``SubmitJobRequest``.

``Client.submit`` takes the same fields as keyword arguments and builds a :class:`JobSpec`;
``Client.submit_many`` takes a sequence of them and sends one ``SubmitJobs`` batch.
Unset optional fields (``thread_demand``, ``timeout_sec``, ``max_attempts``) are left out of the request
so that the control plane applies its defaults.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from google.protobuf import timestamp_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from corral.errors import InvalidArgument
from corral.job import JobState, Notify, dict_to_struct
from corral.limits import MAX_GPUS, MAX_MEMORY_MB, PROTO_INT_RANGES
from corral.v1 import jobs_pb2

__all__ = ["JobSpec", "When", "batch_request", "by_id", "put", "put_in_range", "to_timestamp"]

M = TypeVar("M", bound=Message)

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
    worker_selector: Mapping[str, str] | None = None
    """Run only on a worker whose labels include every key=value here (``{"gpu": "a100"}``)."""
    depends_on: Sequence[str] = ()
    """Ids of jobs that must SUCCEED before this one starts (if one fails, this one is CANCELLED)."""
    gpu_count: int = 0
    """GPUs the job needs (0..64): it runs only on a worker with that many free (CORRAL_WORKER_GPUS),
    and sees only those devices (CUDA_VISIBLE_DEVICES)."""
    memory_mb: int = 0
    """Memory the job needs, in MiB (0..1073741824; 0 reserves none): it runs only on a worker with that
    much not held by its other jobs (CORRAL_WORKER_MEMORY_MB)."""
    depends_on_index: Sequence[int] = ()
    """In :meth:`Client.submit_many <corral.Client.submit_many>` only: earlier specs of the same batch
    that must SUCCEED before this one starts, by their place in it (0 is the first), so a whole graph
    goes in one call. The job's ``depends_on`` then lists their ids."""
    notify: Sequence[Notify] = ()
    """Where to announce the job's end, by email or webhook (at most 8; see :class:`~corral.job.Notify`)."""
    start_when: str = "ALL_SUCCEEDED"
    """What the jobs of ``depends_on`` (and ``depends_on_index``) must do before this one starts:
    ``ALL_SUCCEEDED`` (one that fails or is cancelled cancels this job) or ``ALL_ENDED`` (every one
    ended, however: for jobs that clean up or report after others)."""

    def to_proto(self) -> jobs_pb2.SubmitJobRequest:
        """Build the ``SubmitJobRequest`` for this spec.

        Raises:
            InvalidArgument: naming the field, for a value the request cannot carry (a wrong type, an
                integer outside the field's range, a time outside 0001..9999, a payload that is not JSON),
                or for ``gpu_count`` / ``memory_mb`` outside :mod:`corral.limits`, which the control plane
                would refuse the same way. The control plane checks the rest (the ranges in ``jobs.proto``).
        """
        request = jobs_pb2.SubmitJobRequest(payload=dict_to_struct(self.payload))
        put(request, "type", self.type)
        put(request, "name", self.name)
        put(request, "priority", self.priority)
        put(request, "idempotency_key", self.idempotency_key)
        for name in ("labels", "worker_selector"):
            put_pairs(getattr(request, name), name, getattr(self, name))
        if isinstance(self.depends_on, str):
            raise InvalidArgument("depends_on", "must be a list of job ids, got a string")
        for i, job_id in enumerate(self.depends_on):
            if not isinstance(job_id, str):
                raise InvalidArgument(f"depends_on[{i}]", f"must be a job id (a string), got {job_id!r}")
            request.depends_on.append(job_id)
        if isinstance(self.depends_on_index, str | bytes):
            raise InvalidArgument("depends_on_index", "must be a list of indices, got a string")
        for i, index in enumerate(self.depends_on_index):
            if isinstance(index, bool) or not isinstance(index, numbers.Integral):
                raise InvalidArgument(
                    f"depends_on_index[{i}]", f"must be the index of a job (an integer), got {index!r}"
                )
            try:
                request.depends_on_index.append(int(index))
            except ValueError:  # beyond int32: no batch is that long
                raise InvalidArgument(f"depends_on_index[{i}]", f"must be the index of a job, got {index}") from None
        if self.start_when != "ALL_SUCCEEDED":
            names = jobs_pb2.StartWhen.keys()
            if not isinstance(self.start_when, str) or self.start_when.upper() not in names:
                raise InvalidArgument("start_when", f"must be {' or '.join(names)}, got {self.start_when!r}")
            request.start_when = jobs_pb2.StartWhen.Value(self.start_when.upper())
        for i, target in enumerate(self.notify):
            request.notify.append(_notify(target, f"notify[{i}]"))
        if self.thread_demand is not None:
            put(request, "thread_demand", self.thread_demand)
        if self.timeout_sec is not None:
            put(request, "timeout_sec", self.timeout_sec)
        if self.max_attempts is not None:
            put(request, "max_attempts", self.max_attempts)
        if self.scheduled_at is not None:
            request.scheduled_at.CopyFrom(to_timestamp(self.scheduled_at, "scheduled_at"))
        put_in_range(request, "gpu_count", self.gpu_count, 0, MAX_GPUS)
        put_in_range(request, "memory_mb", self.memory_mb, 0, MAX_MEMORY_MB)
        return request


def _notify(target: Notify, field: str) -> jobs_pb2.Notify:
    """A :class:`~corral.job.Notify` as its message; :class:`InvalidArgument` on ``field`` when it is not one
    or a value does not fit (the control plane checks the rest)."""
    if not isinstance(target, Notify):
        raise InvalidArgument(field, f"must be a corral.Notify, got {type(target).__name__}")
    pb = jobs_pb2.Notify()
    put(pb, "email", target.email, f"{field}.email")
    put(pb, "webhook_url", target.webhook_url, f"{field}.webhook_url")
    if isinstance(target.on, str):
        raise InvalidArgument(f"{field}.on", "must be a list of states, got a string")
    for n, state in enumerate(target.on):
        try:
            pb.on.append(JobState.parse(state).value)  # type: ignore[arg-type]
        except (InvalidArgument, ValueError, TypeError, AttributeError):
            raise InvalidArgument(f"{field}.on[{n}]", f"must be a job state, got {state!r}") from None
    return pb


def batch_request(specs: Sequence[JobSpec]) -> jobs_pb2.SubmitJobsRequest:
    """Build a ``SubmitJobsRequest``; a bad field is :class:`InvalidArgument` on ``jobs[i].field``,
    the name the control plane gives it."""
    request = jobs_pb2.SubmitJobsRequest()
    for i, spec in enumerate(specs):
        try:
            request.jobs.append(spec.to_proto())
        except InvalidArgument as exc:
            raise InvalidArgument(f"jobs[{i}].{exc.field}", exc.rule) from None
    return request


def by_id(request_type: Callable[[], M], id: str) -> M:
    """A request naming one job or worker (``GetJobRequest``, ``DrainWorkerRequest`` ...); an ``id`` that is
    not a string is :class:`InvalidArgument` on ``id``."""
    request = request_type()
    put(request, "id", id)
    return request


def put(target: Message | MutableMapping[str, Any], name: str, value: Any, field: str = "") -> None:
    """Set a scalar field (or map entry) of a request; :class:`InvalidArgument` on ``field`` (the name
    by default) instead of protobuf's unnamed TypeError/ValueError when the value does not fit."""
    try:
        if isinstance(target, Message):
            setattr(target, name, value)
        else:
            target[name] = value
    except (TypeError, ValueError):
        raise InvalidArgument(field or name, _rule(target, name, value)) from None


def put_in_range(target: Message, name: str, value: Any, low: int, high: int) -> None:
    """Set an integer field of a request to ``value`` in ``low..high``; :class:`InvalidArgument` on the
    field otherwise (also for a bool or a string of digits, which are not integers here)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgument(name, f"must be an integer between {low} and {high}, got {value!r}")
    if not low <= int(value) <= high:  # worded as the control plane words it
        raise InvalidArgument(name, f"must be between {low} and {high}, got {int(value)}")
    put(target, name, int(value))


def put_pairs(target: MutableMapping[str, str], name: str, pairs: Mapping[str, str] | None) -> None:
    """Copy ``pairs`` (None: none) into the map field ``target`` of a request (its ``labels``, ...);
    :class:`InvalidArgument` on ``name`` unless they are a mapping of strings to strings (a list of
    pairs or a "k=v" string would otherwise be an AttributeError, naming nothing)."""
    pairs = pairs or {}
    if not isinstance(pairs, Mapping):
        raise InvalidArgument(name, f"must be a mapping of strings to strings, got {type(pairs).__name__}")
    for key, value in pairs.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidArgument(f"{name}[{key}]", f"keys and values must be strings, got {value!r}")
        put(target, key, value, f"{name}[{key}]")


def _rule(target: Message | MutableMapping[str, Any], name: str, value: Any) -> str:
    """What a value of the field must be (map entries of a request are strings)."""
    string = FieldDescriptor.CPPTYPE_STRING
    kind = target.DESCRIPTOR.fields_by_name[name].cpp_type if isinstance(target, Message) else string
    if kind in PROTO_INT_RANGES:
        low, high = PROTO_INT_RANGES[kind]
        return f"must be an integer between {low} and {high}, got {value!r}"
    if kind in (FieldDescriptor.CPPTYPE_DOUBLE, FieldDescriptor.CPPTYPE_FLOAT):
        return f"must be a number, got {value!r}"
    if isinstance(value, str):
        return "is not valid UTF-8 (an unpaired surrogate)"
    return f"must be a string, got {value!r}"


def to_timestamp(when: When, what: str = "time") -> timestamp_pb2.Timestamp:
    """Convert a ``datetime`` (naive means UTC) or Unix seconds to a ``Timestamp``.

    Raises:
        InvalidArgument: on ``what`` when ``when`` is neither, or is outside what a ``Timestamp`` holds
            (0001-01-01 .. 9999-12-31 in UTC).
    """
    ts = timestamp_pb2.Timestamp()
    if isinstance(when, datetime):
        try:
            ts.FromDatetime(when if when.tzinfo else when.replace(tzinfo=UTC))
        except (OverflowError, ValueError):  # 0001-01-01T00:00+05:00 is in year 0 in UTC, which no datetime holds
            raise InvalidArgument(
                what, f"must be between 0001-01-01 and 9999-12-31 in UTC, got {when.isoformat()}"
            ) from None
    elif isinstance(when, int | float) and not isinstance(when, bool) and math.isfinite(when):
        whole = math.floor(when)  # split first: a double holds Unix nanoseconds only to ~100 ns
        try:
            ts.FromNanoseconds(whole * 1_000_000_000 + round((when - whole) * 1e9))
        except ValueError:  # a Timestamp holds 0001-01-01 .. 9999-12-31 only
            raise InvalidArgument(what, f"must be between 0001-01-01 and 9999-12-31, got {when!r}") from None
    else:
        raise InvalidArgument(what, f"must be a datetime or Unix seconds, got {when!r}")
    return ts
