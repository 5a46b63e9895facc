"""Proto <-> domain conversions: the only place where generated messages and domain objects meet."""

from __future__ import annotations

import json
import math
from typing import Any

from google.protobuf import json_format, struct_pb2
from google.protobuf.message import Message

from control.admission import Submission, check_labels
from control.admission.validation import MAX_TYPE, check_text
from control.autoscale import AutoscalerState
from control.jobs import JobRecord, JobState
from control.notify import NotifyTarget, end_state
from control.queue_view import QueuedJob
from control.registry import Assignment, WorkerEntry
from control.sessions import Hello, Outcome, Report
from control.shares import ShareRow
from control.store import AccountEntry, AuditEntry, JobTypeEntry
from corral.errors import InvalidArgument
from corral.job_ids import check_id
from corral.jobtypes import MAX_EXACT_INTEGER
from corral.limits import MAX_GPUS, MAX_MEMORY_MB, MAX_OUTPUT_BYTES, MAX_THREADS, MAX_WORKER_ID
from corral.v1 import accounts_pb2, admin_pb2, jobs_pb2, workers_pb2

_EXACT = float(MAX_EXACT_INTEGER)

ENCODED_PER_JSON_BYTE = 5.5
"""The most bytes a payload Struct takes encoded for each byte of its compact JSON: a number in a list
takes 11 (the entry's tag and length, the Value's tag and a double's 8 bytes) for at least 2 of JSON
(``1,``); a key, a string, a bool, a null or a nested list or object takes fewer for what its JSON
holds. ``tests/unit/control/test_payload_bound.py`` tries the worst shapes."""
ENCODED_SLACK_BYTES = 64
"""What the bound allows on top of the ratio: a tiny payload's JSON (``[1]``) is not 2 bytes a number."""


def check_encoded_payload(payload: struct_pb2.Struct, max_json_bytes: int, field: str) -> int:
    """Refuse a payload whose encoded size alone shows that its JSON is over ``max_json_bytes``, before
    any conversion (one C call: converting a payload costs about 0.15 s a MB of it encoded, on the
    event loop); returns that size.

    Raises:
        InvalidArgument: naming ``field`` and the limit.
    """
    size = payload.ByteSize()
    if size > max_json_bytes * ENCODED_PER_JSON_BYTE + ENCODED_SLACK_BYTES:
        least = int((size - ENCODED_SLACK_BYTES) / ENCODED_PER_JSON_BYTE)
        raise InvalidArgument(
            field, f"is at least {least} bytes as JSON ({size} bytes encoded); the limit is {max_json_bytes} bytes"
        )
    return size


def plain(value: Any) -> Any:
    """JSON values out of a Struct: integral floats within 2**53 become ints again, but for a negative
    zero, which an int cannot hold (gRPC carries its sign, and Go's protojson writes it ``-0``)."""
    if isinstance(value, float):
        if value.is_integer() and abs(value) <= _EXACT and (value or math.copysign(1.0, value) > 0):
            return int(value)
        return value
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def struct_to_dict(msg: struct_pb2.Struct) -> dict[str, Any]:
    """A payload Struct as JSON values (see :func:`plain`); a number that is not finite, which JSON cannot
    hold, is :class:`InvalidArgument` naming its path (``payload.a``)."""
    if not msg.fields:
        return {}
    try:
        out: dict[str, Any] = plain(json_format.MessageToDict(msg))
    except ValueError:  # json_format refuses NaN and infinities in a Value
        path, number = _non_finite(msg, "payload") or ("payload", math.nan)
        raise InvalidArgument(path, f"must be a finite number, got {number}") from None
    return out


def _non_finite(
    value: struct_pb2.Struct | struct_pb2.ListValue | struct_pb2.Value, path: str
) -> tuple[str, float] | None:
    """The first number in ``value`` that is NaN or infinite, with its path."""
    if isinstance(value, struct_pb2.Struct):
        items: Any = ((f"{path}.{k}", v) for k, v in value.fields.items())
    elif isinstance(value, struct_pb2.ListValue):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value.values))
    else:
        kind = value.WhichOneof("kind")
        if kind == "number_value":
            return None if math.isfinite(value.number_value) else (path, value.number_value)
        if kind in ("struct_value", "list_value"):
            return _non_finite(getattr(value, kind), path)
        return None
    for item_path, item in items:
        if (found := _non_finite(item, item_path)) is not None:
            return found
    return None


def target_id(value: str) -> str:
    """The ``id`` of a request naming one job or worker; InvalidArgument when empty or too long."""
    return check_id(value, "id")


def _set_struct(target: struct_pb2.Struct, text: str) -> None:
    if text and text != "{}":
        target.update(json.loads(text))


def payload_struct(text: str) -> struct_pb2.Struct:
    """A stored payload's JSON as a Struct (what :func:`job` makes for ``payload``), made apart so that a
    large one can be made off the event loop and handed to :func:`job`."""
    out = struct_pb2.Struct()
    _set_struct(out, text)
    return out


def set_time(target: Any, t: float | None) -> None:
    """Set the Timestamp ``target`` to ``t`` (Unix seconds), to the microsecond; None leaves it unset.

    Times are kept as float seconds, which hold microseconds (to 2100 and well past); nanoseconds from
    ``t * 1e9`` showed the float's error instead (``00.123Z`` sent came back ``00.123000064Z``), and a
    client that sent back the time it was shown had its idempotency key refused as another request."""
    if t is not None:
        seconds = math.floor(t)
        micros = round((t - seconds) * 1e6)  # t - floor(t) is exact; t * 1e9 was not (32 µs off in 9999)
        if micros == 1_000_000:
            seconds, micros = seconds + 1, 0
        if seconds > _MAX_SECONDS:  # 9999-12-31T23:59:59.9999999 is 253402300800.0 as a float
            seconds, micros = _MAX_SECONDS, 999_999
        target.seconds = seconds
        target.nanos = micros * 1000


def _time(msg: Message, name: str) -> float | None:
    if not msg.HasField(name):
        return None
    ts = getattr(msg, name)
    if not (_MIN_SECONDS <= ts.seconds <= _MAX_SECONDS and 0 <= ts.nanos < 1_000_000_000):
        raise InvalidArgument(
            name,
            f"must be a valid Timestamp (0001-01-01..9999-12-31, nanos 0..999999999), got {ts.seconds}s {ts.nanos}ns",
        )
    value: float = ts.ToNanoseconds() / 1e9
    return value


# What google/protobuf/timestamp.proto allows: 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59Z.
_MIN_SECONDS = -62_135_596_800
_MAX_SECONDS = 253_402_300_799


def submission(req: jobs_pb2.SubmitJobRequest, idempotency_key: str = "") -> Submission:
    """A SubmitJobRequest as a domain Submission (``idempotency_key`` from metadata when the field is empty;
    when both are given they must agree)."""
    if idempotency_key and req.idempotency_key and req.idempotency_key != idempotency_key:
        # Either one taken over the other would make a job under a key the caller did not mean.
        raise InvalidArgument(
            "idempotency_key",
            "differs from the idempotency-key metadata (over REST, the Idempotency-Key or X-Idempotency-Key "
            f"header): {req.idempotency_key!r} and {idempotency_key!r}; give the key once, or the same in both",
        )
    timeout = req.timeout_sec if req.HasField("timeout_sec") else None
    if timeout is not None and math.isnan(timeout):
        raise InvalidArgument("timeout_sec", "must be a number, got NaN")
    return Submission(
        type=req.type,
        payload=struct_to_dict(req.payload),
        name=req.name,
        priority=req.priority,
        thread_demand=req.thread_demand if req.HasField("thread_demand") else None,
        timeout_sec=timeout,
        max_attempts=req.max_attempts if req.HasField("max_attempts") else None,
        scheduled_at=_time(req, "scheduled_at"),
        idempotency_key=req.idempotency_key or idempotency_key,
        labels=dict(req.labels) if req.labels else {},  # iterating an empty proto map costs µs
        worker_selector=dict(req.worker_selector) if req.worker_selector else {},
        depends_on=tuple(req.depends_on) if req.depends_on else (),
        gpu_count=req.gpu_count,
        memory_mb=req.memory_mb,
        depends_on_index=tuple(req.depends_on_index) if req.depends_on_index else (),
        notify=tuple(_target(t, f"notify[{i}]") for i, t in enumerate(req.notify)) if req.notify else (),
        start_when=req.start_when,
    )


def _target(t: jobs_pb2.Notify, field: str) -> NotifyTarget:
    """A Notify as a domain target (its other rules are checked at admission, control.notify)."""
    on = tuple(end_state(state, f"{field}.on[{n}]") for n, state in enumerate(t.on))
    return NotifyTarget(email=t.email, webhook_url=t.webhook_url, on=on)


def job(j: JobRecord, payload: struct_pb2.Struct | None = None) -> jobs_pb2.Job:
    """The proto of a job record; ``payload``: its payload made already (:func:`payload_struct`)."""
    out = jobs_pb2.Job(
        id=j.id,
        name=j.name,
        type=j.type,
        priority=j.priority,
        thread_demand=j.thread_demand,
        threads_granted=j.threads_granted,
        state=int(j.state),  # type: ignore[arg-type]
        attempts=j.attempts,
        max_attempts=j.max_attempts,
        charged_attempts=j.charged_attempts,
        timeout_sec=j.timeout_sec,
        queue_seconds=j.queue_seconds,
        exec_seconds=j.exec_seconds,
        total_seconds=j.total_seconds,
        worker_id=j.worker_id,
        idempotency_key=j.idempotency_key,
        labels=j.labels,
    )
    # Set only when there is something to set: most jobs have none of these, and each keyword costs.
    if j.owner:
        out.owner = j.owner
    if j.worker_selector:
        out.worker_selector.update(j.worker_selector)
    if j.output:
        out.output = j.output
    if j.gpu_count:
        out.gpu_count = j.gpu_count
    if j.memory_mb:
        out.memory_mb = j.memory_mb
    if j.depends_on:
        out.depends_on.extend(j.depends_on)
        out.waiting_on.extend(sorted(j.waiting_on))
    if j.start_when:
        out.start_when = int(j.start_when)  # type: ignore[assignment]
    for t in j.notify:
        out.notify.add(email=t.email, webhook_url=t.webhook_url, on=[int(s) for s in t.on])  # type: ignore[misc]
    if payload is not None:
        out.payload.CopyFrom(payload)
    else:
        _set_struct(out.payload, j.payload_json)
    _set_struct(out.result, j.result_json)
    if j.state is JobState.SUCCEEDED:
        out.result.SetInParent()  # an empty result ({}: noop's) is still a result, not one to come
    if j.error_code:
        out.error.code = j.error_code
        out.error.message = j.error_message
    set_time(out.scheduled_at, j.scheduled_at)
    set_time(out.created_at, j.created_at)
    set_time(out.started_at, j.started_at)
    set_time(out.finished_at, j.finished_at)
    set_time(out.ready_at, j.ready_at)
    return out


def queued_job(q: QueuedJob) -> jobs_pb2.Job:
    """The proto of a job in the queue view: the job, its place and its estimated start."""
    out = job(q.job)
    out.queue_position = q.position
    set_time(out.estimated_start_time, q.estimated_start)
    return out


def worker(w: WorkerEntry) -> admin_pb2.Worker:
    """The proto of a registry entry: its running jobs' ids sorted, ``last_seen`` as ``last_heartbeat_at``.

    What is free is never shown below 0: a worker that holds more than it has (an entry rebuilt from the
    store before its worker reconnects, or a worker back with less) has nothing free, whatever it owes."""
    out = admin_pb2.Worker(
        id=w.id,
        state=int(w.state),  # type: ignore[arg-type]
        threads=w.threads,
        slots=w.slots,
        free_threads=max(0, w.free_threads),
        free_slots=max(0, w.free_slots),
        running_jobs=sorted(job_id for job_id, _ in w.running),
        labels=w.labels,
        hostname=w.hostname,
        pid=w.pid,
        jobs_completed=w.jobs_completed,
        jobs_failed=w.jobs_failed,
        gpus=w.gpus,
        free_gpus=max(0, w.free_gpus),
        memory_mb=w.memory_mb,
        free_memory_mb=max(0, w.free_memory_mb),
    )
    set_time(out.registered_at, w.registered_at)
    set_time(out.last_heartbeat_at, w.last_seen)
    return out


def hello(reg: workers_pb2.Register) -> Hello:
    """A Register as the domain :class:`Hello`, once its fields are checked (InvalidArgument naming
    ``register.<field>``). A running attempt without a ``running_threads`` entry holds 1 thread; a job type without a
    name is left out."""
    if not reg.worker_id:
        raise InvalidArgument("register.worker_id", "is required")
    # Stored with every job it runs and shown everywhere: the worker's own rule's length, and no NUL
    # (which no store keeps as it is).
    check_text("register.worker_id", reg.worker_id, MAX_WORKER_ID)
    for i, t in enumerate(reg.job_types):
        check_text(f"register.job_types[{i}].name", t.name, MAX_TYPE)
    for name, value in (("threads", reg.threads), ("slots", reg.slots)):
        if not 1 <= value <= MAX_THREADS:
            raise InvalidArgument(f"register.{name}", f"must be between 1 and {MAX_THREADS}, got {value}")
    if not 0 <= reg.gpus <= MAX_GPUS:
        raise InvalidArgument("register.gpus", f"must be between 0 and {MAX_GPUS}, got {reg.gpus}")
    if not 0 <= reg.memory_mb <= MAX_MEMORY_MB:
        raise InvalidArgument("register.memory_mb", f"must be between 0 and {MAX_MEMORY_MB}, got {reg.memory_mb}")
    if not (math.isfinite(reg.registered_since) and reg.registered_since >= 0):
        raise InvalidArgument("register.registered_since", f"must be a finite time >= 0, got {reg.registered_since}")
    labels = dict(reg.labels)
    check_labels(labels, "register.labels")  # they show in ListWorkers, the CLI and the dashboards
    threads = list(reg.running_threads)
    running = {(a.job_id, a.attempt): (threads[i] if i < len(threads) else 1) for i, a in enumerate(reg.running)}
    return Hello(
        worker_id=reg.worker_id,
        threads=reg.threads,
        slots=reg.slots,
        gpus=reg.gpus,
        memory_mb=reg.memory_mb,
        labels=labels,
        hostname=reg.hostname,
        pid=reg.pid,
        running=running,
        finished={(a.job_id, a.attempt) for a in reg.finished},
        job_types=[JobTypeEntry(t.name, t.payload_schema_json, t.description) for t in reg.job_types if t.name],
        registered_since=reg.registered_since,
    )


def reports(msg: workers_pb2.Results) -> list[Report]:
    """A worker's Results as domain reports: an unknown outcome counts as FAILED, and output longer than
    MAX_OUTPUT_BYTES characters keeps only its end."""
    return [
        Report(
            job_id=r.attempt.job_id,
            attempt=r.attempt.attempt,
            outcome=Outcome(r.outcome) if r.outcome in Outcome._value2member_map_ else Outcome.FAILED,
            result_json=r.result_json,
            error_code=r.error_code,
            error_message=r.error_message,
            started_at=r.started_at,
            finished_at=r.finished_at,
            # the worker keeps at most this much; a worker that sends more has its start cut here
            output=r.output if len(r.output) <= MAX_OUTPUT_BYTES else r.output[-MAX_OUTPUT_BYTES:],
        )
        for r in msg.results
    ]


def add_assignments(target: workers_pb2.Assign, batch: list[Assignment]) -> None:
    """Append ``batch`` to an Assign message (``gpus`` set only for a job that holds some)."""
    add = target.assignments.add
    for a in batch:
        added = add(
            job_id=a.job_id,
            attempt=a.attempt,
            type=a.type,
            payload_json=a.payload_json,
            threads=a.threads,
            timeout_sec=a.timeout_sec,
        )
        if a.gpus:  # most jobs hold none: no keyword to pay for then
            added.gpus = a.gpus


def add_attempt_refs(target: Any, keys: list[tuple[str, int]]) -> None:
    """Append AttemptRefs for ``keys`` to a repeated field."""
    add = target.add
    for job_id, attempt in keys:
        add(job_id=job_id, attempt=attempt)


def attempt_refs(keys: list[tuple[str, int]]) -> list[workers_pb2.AttemptRef]:
    """AttemptRef messages for ``(job_id, attempt)`` keys."""
    return [workers_pb2.AttemptRef(job_id=j, attempt=a) for j, a in keys]


def autoscaler(st: AutoscalerState) -> admin_pb2.AutoscalerStatus:
    """The autoscaler's state as GET /v1/autoscaler shows it."""
    out = admin_pb2.AutoscalerStatus(
        mode=st.mode,
        current_workers=st.current,
        desired_workers=st.desired,
        min_workers=st.min_workers,
        max_workers=st.max_workers,
        last_error=st.last_error,
        starting_workers=st.starting,
        draining_workers=st.draining,
        scale_ups=st.scale_ups,
        scale_downs=st.scale_downs,
        cooldown_remaining_sec=st.cooldown_remaining,
    )
    if st.last_decision is not None:
        out.last_decision = st.last_decision.summary()
        set_time(out.last_decision_at, st.last_decision_at)
    if st.last_error_at:
        set_time(out.last_error_at, st.last_error_at)
    if st.last_action is not None:
        out.last_action = st.last_action.action.value
        out.last_action_step = st.last_action.step
        out.last_action_reason = st.last_action.reason
        set_time(out.last_action_at, st.last_action_at)
    if st.snapshot is not None:
        out.ready_jobs = st.snapshot.ready_jobs
        out.ready_threads = st.snapshot.ready_threads
        out.oldest_ready_age_sec = st.snapshot.oldest_ready_age
        out.free_threads = st.snapshot.free_threads
    return out


def account(a: AccountEntry, group: str, admin: bool) -> accounts_pb2.Account:
    """The proto of an account, with the ``group`` and ``admin`` given (control.access knows them); never its password
    hash or session."""
    out = accounts_pb2.Account(name=a.name, group=group, admin=admin)
    set_time(out.created_at, a.created_at)
    set_time(out.password_changed_at, a.password_changed_at)
    return out


def share(row: ShareRow) -> admin_pb2.Share:
    """The proto of one share of the cluster, as ListShares lists it (control.shares)."""
    return admin_pb2.Share(
        name=row.name,
        owners=row.owners,
        weight=row.weight,
        running_jobs=row.running_jobs,
        threads=row.threads,
        gpus=row.gpus,
        memory_mb=row.memory_mb,
        queued_jobs=row.queued_jobs,
        dominant_share=row.dominant_share,
        recent_share=row.recent_share,
        rank=row.rank,
        thread_seconds=row.thread_seconds,
        gpu_seconds=row.gpu_seconds,
    )


def audit_event(e: AuditEntry) -> admin_pb2.AuditEvent:
    """The proto of an audit log entry, its Unix ``time`` as a Timestamp."""
    out = admin_pb2.AuditEvent(
        seq=e.seq, actor=e.actor, action=e.action, target=e.target, outcome=e.outcome, request_id=e.request_id
    )
    set_time(out.time, e.time)
    return out
