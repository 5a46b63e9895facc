"""A job as the client sees it: :class:`Job`, its :class:`JobState` and :class:`JobError`, and :class:`JobPage`.

These are plain, frozen Python values built from the ``corral.v1.Job`` message by :meth:`Job.from_proto`:
``google.protobuf.Struct`` becomes ``dict`` (with integral numbers turned back into ``int``, since JSON
numbers travel as doubles), ``Timestamp`` becomes an aware UTC ``datetime`` (``None`` when unset) and the
state enum becomes :class:`JobState`. :meth:`Job.to_dict` gives the JSON-ready form the CLI prints.

The helpers :func:`struct_to_dict` and :func:`dict_to_struct` are the one place the client converts JSON
objects to and from ``Struct``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import json_format, struct_pb2, timestamp_pb2

from corral.errors import InvalidArgument
from corral.jobtypes import MAX_EXACT_INTEGER, MAX_JSON_DEPTH, too_deep
from corral.v1 import jobs_pb2

__all__ = [
    "Changed",
    "Job",
    "JobError",
    "JobPage",
    "JobState",
    "check_json_value",
    "dict_to_struct",
    "result_fault",
    "struct_to_dict",
    "timestamp_to_datetime",
]


class JobState(enum.IntEnum):
    """The lifecycle state of a job; values and names match ``corral.v1.Job.State``."""

    STATE_UNSPECIFIED = 0
    SCHEDULED = 1
    """Waiting for ``scheduled_at`` or for a retry backoff to elapse."""
    PENDING = 2
    """Ready to run, waiting for a worker with free capacity."""
    RUNNING = 3
    """Leased to one worker."""
    SUCCEEDED = 4
    FAILED = 5
    """Every attempt failed: the job is in the dead-letter queue until retried."""
    CANCELLED = 6

    @property
    def is_terminal(self) -> bool:
        """True for SUCCEEDED, FAILED and CANCELLED: nothing happens to the job any more."""
        return self in _TERMINAL

    @classmethod
    def of(cls, number: int) -> JobState:
        """The state with this wire value; STATE_UNSPECIFIED for a value this client does not know."""
        try:
            return cls(number)
        except ValueError:
            return cls.STATE_UNSPECIFIED

    @classmethod
    def parse(cls, value: JobState | str | int) -> JobState:
        """Return the state named by ``value`` (a member, a case-insensitive name or a number).

        Raises:
            InvalidArgument: on ``status``, for a name or number that is no state, or a value of another
                type (None, a float, a bool).
        """
        if isinstance(value, JobState):
            return value
        names = ", ".join(s.name for s in cls if s is not cls.STATE_UNSPECIFIED)
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise InvalidArgument("status", f"must be a state's name or number (one of {names}), got {value!r:.80}")
        try:
            return cls(value) if isinstance(value, int) else cls[value.strip().upper()]
        except (KeyError, ValueError):
            raise InvalidArgument("status", f"unknown state {value!r:.80}; one of {names}") from None


_TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


@dataclass(frozen=True)
class JobError:
    """Why an attempt or a job failed: ``code`` is ERROR, TIMEOUT, WORKER_LOST, LEASE_EXPIRED, CANCELLED, ..."""

    code: str
    message: str


@dataclass(frozen=True)
class Notify:
    """Where to announce a job's end: an email address or a webhook URL (set exactly one), for the ends
    listed in ``on`` (SUCCEEDED, FAILED, CANCELLED; empty: every end). The control plane submits an
    ``email`` or ``webhook`` job for each end it wants (see ``SubmitJobRequest.notify`` in jobs.proto)."""

    email: str = ""
    """Sent through the SMTP server of the worker that runs the email job (CORRAL_SMTP_*)."""
    webhook_url: str = ""
    """http:// or https://; it gets a POST of the ended job as GetJob's JSON."""
    on: tuple[JobState, ...] = ()

    @classmethod
    def from_proto(cls, pb: jobs_pb2.Notify) -> Notify:
        """Build a :class:`Notify` from a ``corral.v1.Notify`` message."""
        return cls(email=pb.email, webhook_url=pb.webhook_url, on=tuple(JobState.of(s) for s in pb.on))


@dataclass(frozen=True)
class Job:
    """Everything known about one job, as of the response it came from."""

    id: str
    type: str
    state: JobState
    name: str = ""
    payload: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    thread_demand: int = 1
    """Threads the job asked for."""
    threads_granted: int = 0
    """Threads the job was given on its latest attempt."""
    attempts: int = 0
    """Attempts started so far."""
    max_attempts: int = 0
    charged_attempts: int = 0
    """Attempts charged against ``max_attempts``: each that ended, counted afresh after a retry
    (:attr:`uncharged_attempts` are the others)."""
    timeout_sec: float = 0.0
    scheduled_at: datetime | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    ready_at: datetime | None = None
    """When the next attempt becomes ready (SCHEDULED jobs)."""
    queue_seconds: float = 0.0
    """Seconds from becoming ready to the start of the latest attempt."""
    exec_seconds: float = 0.0
    """Seconds the latest attempt ran."""
    total_seconds: float = 0.0
    """Seconds from submission to the terminal state."""
    worker_id: str = ""
    result: dict[str, Any] | None = None
    """The job's JSON result; ``None`` until it succeeded."""
    error: JobError | None = None
    idempotency_key: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    owner: str = ""
    """Who submitted it: the name of the client token it came with ("" without auth)."""
    worker_selector: dict[str, str] = field(default_factory=dict)
    """The labels a worker must have to run it (empty: any worker)."""
    output: str = ""
    """The end of what its latest attempt printed (as its worker kept it)."""
    depends_on: list[str] = field(default_factory=list)
    """Jobs that must SUCCEED before it starts."""
    waiting_on: list[str] = field(default_factory=list)
    """Those of ``depends_on`` that have not SUCCEEDED yet."""
    gpu_count: int = 0
    """GPUs the job holds while it runs (0: none)."""
    memory_mb: int = 0
    """Memory the job holds while it runs, in MiB (0: none reserved)."""
    queue_position: int = 0
    """From :meth:`Client.queue` only: its place among all PENDING jobs, 1 for the next (else 0)."""
    estimated_start: datetime | None = None
    """From :meth:`Client.queue` only: when it should start at the rate the queue has drained over the
    last 15 minutes (None when nothing started in that time)."""
    notify: list[Notify] = field(default_factory=list)
    """Where its ends are announced."""
    start_when: str = "ALL_SUCCEEDED"
    """What the jobs of ``depends_on`` must do before it starts: ``ALL_SUCCEEDED`` or ``ALL_ENDED``."""

    @property
    def is_terminal(self) -> bool:
        """True once the job SUCCEEDED, FAILED or was CANCELLED."""
        return self.state.is_terminal

    @property
    def uncharged_attempts(self) -> int:
        """Attempts that ended without being charged against ``max_attempts``: handed back unfinished by
        their worker (its drain deadline), or made before a retry. Why ``attempts`` may pass it."""
        running = 1 if self.state is JobState.RUNNING else 0
        return max(0, self.attempts - self.charged_attempts - running)

    @classmethod
    def from_proto(cls, pb: jobs_pb2.Job) -> Job:
        """Build a :class:`Job` from a ``corral.v1.Job`` message."""
        return cls(
            id=pb.id,
            name=pb.name,
            type=pb.type,
            payload=struct_to_dict(pb.payload),
            priority=pb.priority,
            thread_demand=pb.thread_demand,
            threads_granted=pb.threads_granted,
            state=JobState.of(pb.state),
            attempts=pb.attempts,
            max_attempts=pb.max_attempts,
            charged_attempts=pb.charged_attempts,
            timeout_sec=pb.timeout_sec,
            scheduled_at=timestamp_to_datetime(pb.scheduled_at) if pb.HasField("scheduled_at") else None,
            created_at=timestamp_to_datetime(pb.created_at) if pb.HasField("created_at") else None,
            started_at=timestamp_to_datetime(pb.started_at) if pb.HasField("started_at") else None,
            finished_at=timestamp_to_datetime(pb.finished_at) if pb.HasField("finished_at") else None,
            ready_at=timestamp_to_datetime(pb.ready_at) if pb.HasField("ready_at") else None,
            queue_seconds=pb.queue_seconds,
            exec_seconds=pb.exec_seconds,
            total_seconds=pb.total_seconds,
            worker_id=pb.worker_id,
            result=struct_to_dict(pb.result) if pb.HasField("result") else None,
            error=JobError(pb.error.code, pb.error.message) if pb.HasField("error") and pb.error.code else None,
            idempotency_key=pb.idempotency_key,
            labels=dict(pb.labels),
            owner=pb.owner,
            worker_selector=dict(pb.worker_selector),
            output=pb.output,
            depends_on=list(pb.depends_on),
            waiting_on=list(pb.waiting_on),
            gpu_count=pb.gpu_count,
            memory_mb=pb.memory_mb,
            queue_position=pb.queue_position,
            estimated_start=(
                timestamp_to_datetime(pb.estimated_start_time) if pb.HasField("estimated_start_time") else None
            ),
            notify=[Notify.from_proto(n) for n in pb.notify],
            start_when=_start_when_name(pb.start_when),
        )

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict: the state by name, datetimes in ISO 8601, the error as an object."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, JobState):
                value = value.name
            elif isinstance(value, datetime):
                value = value.isoformat()
            elif isinstance(value, JobError):
                value = dataclasses.asdict(value)
            elif f.name == "notify":
                value = [{"email": n.email, "webhook_url": n.webhook_url, "on": [s.name for s in n.on]} for n in value]
            out[f.name] = value
        return out


def _start_when_name(value: int) -> str:
    """A ``StartWhen`` by name (its number, for a value this client does not know)."""
    try:
        return jobs_pb2.StartWhen.Name(value)  # type: ignore[arg-type]
    except ValueError:
        return str(value)


@dataclass(frozen=True)
class JobPage:
    """One page of :meth:`Client.list`: the jobs (newest first) and how many match the filters in total."""

    jobs: list[Job]
    total: int


@dataclass(frozen=True)
class Changed:
    """What one :meth:`Client.cancel_many` or :meth:`Client.retry_many` call did: the ids of the jobs
    it changed (oldest first, each committed) and how many more jobs matched beyond its limit."""

    ids: list[str]
    remaining: int


def struct_to_dict(struct: struct_pb2.Struct) -> dict[str, Any]:
    """Convert a ``Struct`` to a dict, turning integral numbers (JSON numbers are doubles) back into ints.

    Keys come in sorted order at every level. A ``Struct`` is a map and keeps no order: it iterates
    neither in the order the keys were given nor in the same order from one process to the next, so
    sorting is what makes a payload or a result print the same way every time (``corral get``,
    ``--json``)."""
    if not struct.fields:  # most payloads of short jobs, and every job's result until it ends
        return {}
    value = _integral(json_format.MessageToDict(struct))
    return value if isinstance(value, dict) else {}


def dict_to_struct(value: Mapping[str, Any] | None, what: str = "payload") -> struct_pb2.Struct:
    """Convert a JSON object to a ``Struct``.

    Raises:
        InvalidArgument: naming the path (``payload.items[2]``) of anything a ``Struct`` cannot carry
            as given: a non-string key, a value that is not JSON, a number that is not finite, an
            integer beyond ±2**53 (it would arrive rounded), or nesting deeper than MAX_JSON_DEPTH.
    """
    struct = struct_pb2.Struct()
    if value is None:
        return struct
    if not isinstance(value, Mapping):
        raise InvalidArgument(what, f"must be a JSON object, got {type(value).__name__}")
    check_json_value(value, what)
    try:
        struct.update(value)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(what, f"not JSON-serialisable: {exc}") from None
    return struct


def check_json_value(value: Any, path: str, *, exact_integers: bool = True) -> None:
    """Refuse, naming its path under ``path``, anything in ``value`` a ``Struct`` cannot carry as given
    (see :func:`dict_to_struct`). ``exact_integers=False`` (results, see :func:`result_fault`) takes an
    integer beyond ±2**53 that a double still holds, rounded."""
    if (where := too_deep(value)) is not None:
        raise InvalidArgument(f"{path}{where}", f"nests deeper than {MAX_JSON_DEPTH} levels of objects and arrays")
    _check_json(value, path, exact_integers)


_parse_as_doubles = json.JSONDecoder(parse_int=float).decode
_strict_json = json.JSONEncoder(allow_nan=False, ensure_ascii=False, check_circular=False).encode


def result_fault(result_json: str) -> str | None:
    """Why a job's result, as JSON text, could not be carried back as a ``Struct`` (GetJob, ListJobs,
    WatchJob would fail on it for everyone), naming the path (``result.x[2]``); None when it can.

    The rule is the payloads' (:func:`check_json_value`), but for integers: one beyond ±2**53 is taken
    (it arrives rounded, as built-in types' big sums do, next to their exact ``sum_text``) up to what a
    double holds (about ±1.8e308); past that it is refused, as are a number that is not finite (``NaN``,
    ``1e400``), a lone surrogate (an escaped ``\\ud800``), text that is not a JSON object, and nesting deeper
    than MAX_JSON_DEPTH.

    This runs for every result (the runner's, and the control plane's for any worker's), so the test
    is a parse and an encode in C: nothing for ``{}``, a few microseconds for a small result; the walk
    in Python that names the path runs only for a result found wrong.
    """
    if result_json == "{}":  # most results
        return None
    try:
        # parse_int=float: an integer beyond a double's range becomes inf, which the encoder refuses
        # with the NaN and the 1e400 (allow_nan=False); encoding to UTF-8 refuses a lone surrogate.
        value = _parse_as_doubles(result_json)
        _strict_json(value).encode()
    except (ValueError, RecursionError):
        return _result_fault_found(result_json)
    if not isinstance(value, dict):
        return f"result: is a JSON {type(value).__name__}, not an object"
    # No value can nest deeper than it has objects and arrays: the walk is for the few that have many.
    if result_json.count("{") + result_json.count("[") > MAX_JSON_DEPTH and (where := too_deep(value)) is not None:
        return f"result{where}: nests deeper than {MAX_JSON_DEPTH} levels of objects and arrays"
    return None


def _result_fault_found(result_json: str) -> str:
    """The fault of a result that :func:`result_fault` found wrong, with its path."""
    try:
        value = json.loads(result_json)
    except RecursionError:
        return f"result: nests deeper than {MAX_JSON_DEPTH} levels of objects and arrays"
    except ValueError as exc:
        return f"result: is not JSON ({type(exc).__name__}: {exc})"
    if not isinstance(value, dict):
        return f"result: is a JSON {type(value).__name__}, not an object"
    try:
        check_json_value(value, "result", exact_integers=False)
    except InvalidArgument as exc:
        return str(exc)
    return "result: cannot be carried as a google.protobuf.Struct"


def _check_json(value: Any, path: str, exact_integers: bool = True) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(path, "is not valid UTF-8 (an unpaired surrogate)") from None
    elif isinstance(value, bool) or value is None:
        pass
    elif isinstance(value, int):
        if exact_integers:
            if abs(value) > MAX_EXACT_INTEGER:
                raise InvalidArgument(
                    path,
                    f"integer {value} is beyond ±2**53 ({MAX_EXACT_INTEGER}): payload numbers travel as "
                    "doubles and it would arrive rounded",
                )
        else:
            try:
                float(value)
            except OverflowError:
                raise InvalidArgument(
                    path,
                    f"integer of {value.bit_length()} bits is beyond what a double holds (about ±1.8e308, "
                    "1024 bits): numbers travel as doubles; return it as text",
                ) from None
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidArgument(path, f"must be a finite number, got {value}")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidArgument(path, f"keys must be strings, got {type(key).__name__} {key!r}")
            _check_json(key, f"{path} (key {key!r})", exact_integers)
            _check_json(item, f"{path}.{key}", exact_integers)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_json(item, f"{path}[{i}]", exact_integers)
    else:
        raise InvalidArgument(
            path, f"must be a JSON value (object, array, string, number, boolean or null), got {type(value).__name__}"
        )


def timestamp_to_datetime(ts: timestamp_pb2.Timestamp) -> datetime:
    """Convert a ``Timestamp`` to an aware UTC ``datetime``, exact to the microsecond.

    (``Timestamp.ToDatetime(tzinfo=...)`` goes through a float and can lose a microsecond.)
    """
    return _EPOCH + timedelta(seconds=ts.seconds, microseconds=ts.nanos // 1000)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _integral(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_integral(v) for v in value]
    return value
