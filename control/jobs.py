"""The job record and its state machine: every state change of a job goes through this module.

::

                 scheduled_at / backoff elapsed
    SCHEDULED ------------------------------------> PENDING ---- lease ----> RUNNING ----> SUCCEEDED
        ^                                              ^                       |
        |        failed attempt, attempts remain       |    handed back        |
        +----------------------------------------------+-----------------------+
                                                                               |
                               failed attempt, no attempts left                v
                                                                            FAILED  (dead-letter queue)
                                                                               |
                                          RetryJob (fresh attempt budget)      |
                                    PENDING <----------------------------------+

    CANCELLED from SCHEDULED, PENDING or RUNNING.

Failure handling
----------------
An attempt is identified by its fencing token ``(job id, attempt number)``. ``attempts`` counts the
leases ever granted, so the token of each new lease is new. A worker's report about an attempt is
applied only while that attempt holds the lease (state RUNNING and ``attempts`` equal); anything
else is stale: a reaped worker that comes back, a result that arrives after a cancel or after a
lease expiry. Stale reports are rejected and change nothing.

A failed attempt (the job raised, timed out, its worker was lost, or its lease expired) is charged
against ``max_attempts``. While attempts remain the job goes back to SCHEDULED with a capped
exponential backoff (``control.backoff``); otherwise it is FAILED. An attempt the worker handed back
unfinished (drain deadline) is not charged: the job is ready again at once.

The functions here only change the in-memory record and check the rules; the caller persists the
record before acknowledging or announcing the change. The compare-and-set on ``(id, attempt)`` is made
here, on the live record, where every change is checked; the store only refuses to write an older
attempt over a newer one.
"""

from __future__ import annotations

import enum
import json
from typing import TYPE_CHECKING, Any

from corral.errors import FailedPrecondition, StaleAttempt

if TYPE_CHECKING:
    from control.notify.targets import NotifyTarget


class JobState(enum.IntEnum):
    """Job states; the values equal the proto's ``Job.State``."""

    SCHEDULED = 1
    PENDING = 2
    RUNNING = 3
    SUCCEEDED = 4
    FAILED = 5
    CANCELLED = 6

    @property
    def terminal(self) -> bool:
        """Whether a job in this state has ended (:data:`TERMINAL`); only RetryJob moves it on from there."""
        return self in TERMINAL


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


class StartWhen(enum.IntEnum):
    """What the jobs a job depends on must do before it starts; the values equal the proto's ``StartWhen``."""

    ALL_SUCCEEDED = 0
    """Every one SUCCEEDED; one that FAILED or was CANCELLED cancels the job (DEPENDENCY_FAILED)."""
    ALL_ENDED = 1
    """Every one ended, however."""

    def met_by(self, state: JobState) -> bool:
        """Whether a dependency in ``state`` has done what this asks of it."""
        return state is JobState.SUCCEEDED or (self is StartWhen.ALL_ENDED and state in TERMINAL)


ALLOWED: dict[JobState, frozenset[JobState]] = {
    JobState.SCHEDULED: frozenset({JobState.PENDING, JobState.CANCELLED}),
    JobState.PENDING: frozenset({JobState.RUNNING, JobState.CANCELLED}),
    JobState.RUNNING: frozenset(
        {JobState.SUCCEEDED, JobState.SCHEDULED, JobState.PENDING, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset({JobState.PENDING}),
    JobState.CANCELLED: frozenset({JobState.SCHEDULED}),
}
"""The allowed transitions: from-state -> to-states. CANCELLED -> SCHEDULED only for a job cancelled for
a failed dependency when that dependency is retried (:func:`revive`)."""

# Error codes recorded on jobs (JobError.code).
ERROR = "ERROR"
TIMEOUT = "TIMEOUT"
WORKER_LOST = "WORKER_LOST"
LEASE_EXPIRED = "LEASE_EXPIRED"
CANCELLED = "CANCELLED"
DEPENDENCY_FAILED = "DEPENDENCY_FAILED"


class JobRecord:
    """Everything known about one job; mutated only by the functions of this module."""

    __slots__ = (
        "attempts",
        "charged_attempts",
        "created_at",
        "depends_on",
        "error_code",
        "error_message",
        "exec_seconds",
        "finished_at",
        "gpu_count",
        "id",
        "idempotency_key",
        "labels",
        "lease_expires_at",
        "max_attempts",
        "memory_mb",
        "name",
        "notify",
        "output",
        "owner",
        "payload_json",
        "priority",
        "queue_seconds",
        "ready_at",
        "request_id",
        "result_json",
        "scheduled_at",
        "seq",
        "start_when",
        "started_at",
        "state",
        "thread_demand",
        "threads_granted",
        "timeout_sec",
        "type",
        "updated_at",
        "waiting_on",
        "worker_id",
        "worker_selector",
    )

    def __init__(
        self,
        *,
        id: str,
        type: str,
        payload_json: str,
        created_at: float,
        name: str = "",
        priority: int = 0,
        thread_demand: int = 1,
        timeout_sec: float = 3600.0,
        max_attempts: int = 3,
        scheduled_at: float | None = None,
        idempotency_key: str = "",
        labels: dict[str, str] | None = None,
        seq: int = 0,
        state: JobState = JobState.PENDING,
        ready_at: float | None = None,
        request_id: str | None = None,
        owner: str = "",
        worker_selector: tuple[tuple[str, str], ...] = (),
        depends_on: tuple[str, ...] = (),
        gpu_count: int = 0,
        memory_mb: int = 0,
        notify: tuple[NotifyTarget, ...] = (),
        start_when: StartWhen = StartWhen.ALL_SUCCEEDED,
    ) -> None:
        self.id = id
        self.start_when = start_when
        """What the jobs of ``depends_on`` must do before it starts."""
        self.notify = notify
        """Where its ends are announced (control.notify; empty: nowhere)."""
        self.gpu_count = gpu_count
        """GPUs it holds while it runs: only a worker with that many free takes it."""
        self.memory_mb = memory_mb
        """Memory (MiB) it holds while it runs: only a worker with that much not held takes it."""
        self.owner = owner
        """Who submitted it: the client token's name ("" when no token is asked for); never changes."""
        self.depends_on = depends_on
        """Jobs that must SUCCEED (or, with ``start_when`` ALL_ENDED, end) before this one starts (empty: none)."""
        self.waiting_on: frozenset[str] = frozenset()
        """Those of ``depends_on`` this one still waits for (in memory; worked out again at start-up)."""
        self.worker_selector = worker_selector
        """``(label, value)`` pairs, sorted, that a worker's labels must all include (empty: any worker).
        A tuple: hashable (the dispatcher keys on it) and free when empty (the common case)."""
        self.request_id = request_id
        """The id of the request that created the job, for its log lines (stored with it; None when none)."""
        self.seq = seq
        self.name = name
        self.type = type
        self.payload_json = payload_json
        self.priority = priority
        self.thread_demand = thread_demand
        self.threads_granted = 0
        self.timeout_sec = timeout_sec
        self.max_attempts = max_attempts
        self.scheduled_at = scheduled_at
        self.idempotency_key = idempotency_key
        self.labels = labels or {}
        self.state = state
        self.attempts = 0
        self.charged_attempts = 0
        self.created_at = created_at
        self.ready_at = created_at if ready_at is None else ready_at
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.queue_seconds = 0.0
        self.exec_seconds = 0.0
        self.worker_id = ""
        self.lease_expires_at: float | None = None
        self.result_json = ""
        self.error_code = ""
        self.error_message = ""
        self.output = ""
        """The end of what the latest attempt printed, as its worker kept it ("" when nothing)."""
        self.updated_at = created_at

    @property
    def total_seconds(self) -> float:
        """Seconds from submission to the terminal state (0 until then)."""
        return (self.finished_at - self.created_at) if self.finished_at is not None else 0.0

    @property
    def payload(self) -> dict[str, Any]:
        """``payload_json`` parsed anew at each call: a new dict, whose changes change nothing."""
        value: dict[str, Any] = json.loads(self.payload_json)
        return value

    def __repr__(self) -> str:
        return f"JobRecord({self.id!r}, {self.type!r}, {self.state.name}, attempt={self.attempts})"


def new_job(job: JobRecord, now: float) -> None:
    """Set the initial state of a submitted job: SCHEDULED when it is due later or waits for other
    jobs (``waiting_on``), else PENDING."""
    if job.waiting_on:
        job.state = JobState.SCHEDULED
        job.ready_at = max(now, job.scheduled_at or now)
    elif job.scheduled_at is not None and job.scheduled_at > now:
        job.state = JobState.SCHEDULED
        job.ready_at = job.scheduled_at
    else:
        job.state = JobState.PENDING
        job.ready_at = now
    job.updated_at = now


def _move(job: JobRecord, to: JobState, now: float) -> JobState:
    before = job.state
    if to not in ALLOWED[before]:
        raise FailedPrecondition(f"job {job.id!r} is {before.name}; it cannot become {to.name}")
    job.state = to
    job.updated_at = now
    return before


def check_attempt(job: JobRecord, attempt: int) -> None:
    """Raise :class:`StaleAttempt` unless ``(job.id, attempt)`` holds the job's lease."""
    if job.state is not JobState.RUNNING:
        raise StaleAttempt(job.id, attempt, f"job is {job.state.name}")
    if job.attempts != attempt:
        raise StaleAttempt(job.id, attempt, f"current attempt is {job.attempts}")


def dependency_met(job: JobRecord, dependency: str) -> bool:
    """One of the jobs ``job`` waits for did what its ``start_when`` asks (SUCCEEDED, or ended at all);
    True when it waits for none any more."""
    job.waiting_on = job.waiting_on - {dependency}
    return not job.waiting_on


def promote(job: JobRecord, now: float) -> None:
    """SCHEDULED -> PENDING: its time came (and every job it depends on SUCCEEDED)."""
    _move(job, JobState.PENDING, now)
    job.ready_at = now


def lease(job: JobRecord, worker_id: str, threads: int, now: float, grace: float) -> int:
    """PENDING -> RUNNING on ``worker_id``; returns the new attempt number (the fencing token)."""
    _move(job, JobState.RUNNING, now)
    job.attempts += 1
    job.worker_id = worker_id
    job.threads_granted = threads
    job.started_at = now
    job.queue_seconds = max(0.0, now - job.ready_at)
    job.lease_expires_at = now + job.timeout_sec + grace
    job.error_code = job.error_message = job.output = ""
    return job.attempts


def adopt(job: JobRecord, attempt: int, worker_id: str, now: float, grace: float) -> None:
    """Keep a RUNNING attempt leased to the worker that reports it after a reconnect or restart."""
    check_attempt(job, attempt)
    job.worker_id = worker_id
    base = job.started_at if job.started_at is not None else now
    job.lease_expires_at = max(base + job.timeout_sec + grace, now + grace)
    job.updated_at = now


def shift_lease(job: JobRecord, seconds: float) -> None:
    """Move the lease's end by ``seconds``: the system time stepped by that much, or the control plane
    stood still that long (control.reaper). The lease still ends after the job's own timeout plus grace,
    not early (a step ahead, a pause) or late (a step back)."""
    if job.lease_expires_at is not None:
        job.lease_expires_at += seconds


def succeed(job: JobRecord, attempt: int, result_json: str, now: float, exec_seconds: float, output: str = "") -> None:
    """RUNNING -> SUCCEEDED with its result (and what it printed)."""
    check_attempt(job, attempt)
    _move(job, JobState.SUCCEEDED, now)
    job.charged_attempts += 1
    job.result_json = result_json
    job.output = output
    job.finished_at = now
    job.exec_seconds = exec_seconds
    job.lease_expires_at = None


def fail_attempt(
    job: JobRecord,
    attempt: int,
    code: str,
    message: str,
    now: float,
    delay: float,
    exec_seconds: float = 0.0,
    output: str = "",
) -> bool:
    """A failed attempt: RUNNING -> SCHEDULED (retry after ``delay``) or FAILED. True when it will retry."""
    check_attempt(job, attempt)
    job.charged_attempts += 1
    job.error_code = code
    job.error_message = message
    job.output = output
    job.exec_seconds = exec_seconds
    job.lease_expires_at = None
    if job.charged_attempts < job.max_attempts:
        _move(job, JobState.SCHEDULED, now)
        job.ready_at = now + delay
        return True
    _move(job, JobState.FAILED, now)
    job.finished_at = now
    return False


def hand_back(job: JobRecord, attempt: int, now: float) -> None:
    """RUNNING -> PENDING without charging the attempt (the worker gave the lease back unfinished)."""
    check_attempt(job, attempt)
    _move(job, JobState.PENDING, now)
    job.ready_at = now
    job.lease_expires_at = None
    job.worker_id = ""


def cancel(job: JobRecord, now: float, code: str = CANCELLED, message: str = "cancelled by request") -> JobState:
    """Any non-terminal state -> CANCELLED (by request, or ``DEPENDENCY_FAILED``); returns the state it left."""
    before = _move(job, JobState.CANCELLED, now)
    job.waiting_on = frozenset()
    job.error_code = code
    job.error_message = message
    job.finished_at = now
    job.lease_expires_at = None
    return before


def revive(job: JobRecord, now: float, waiting_on: frozenset[str]) -> None:
    """CANCELLED for a failed dependency -> SCHEDULED, waiting for ``waiting_on`` again: the job it
    depended on was retried (RetryJob). Such a job never started, so it has no attempt to undo."""
    if job.error_code != DEPENDENCY_FAILED:
        raise FailedPrecondition(f"job {job.id!r} was not cancelled for a failed dependency")
    _move(job, JobState.SCHEDULED, now)
    job.waiting_on = waiting_on
    job.error_code = job.error_message = ""
    job.finished_at = None
    job.ready_at = max(now, job.scheduled_at or now)


def redrive(job: JobRecord, now: float) -> None:
    """FAILED -> PENDING with a fresh attempt budget (RetryJob)."""
    _move(job, JobState.PENDING, now)
    job.charged_attempts = 0
    job.ready_at = now
    job.finished_at = None
    job.result_json = ""
