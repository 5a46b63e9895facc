"""WorkerSessions: the control plane's side of the worker protocol (see workers.proto).

Registration re-adopts the attempts a reconnecting worker still runs and declares lost the ones it
no longer knows; results are applied only for the attempt that holds the lease (fencing), and are
acknowledged once committed, stale or not, so that the worker can forget them.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field

from control import jobs
from control.dispatch import needs_of
from control.jobs import JobState
from control.registry import AttemptKey, Needs, WorkerEntry, WorkerLink
from control.scheduler import Scheduler
from control.store import JobTypeEntry
from corral import logs
from corral.errors import AlreadyExists, NotFound, StaleAttempt
from corral.job import result_fault

logger = logging.getLogger(__name__)

MIN_DRAIN_SEC = 0.001
"""The deadline sent to a worker back after its operator's drain deadline passed: hand back at once."""


class Outcome(enum.IntEnum):
    """Values equal the proto's ``JobResult.Outcome``."""

    SUCCEEDED = 1
    FAILED = 2
    TIMEOUT = 3
    CANCELLED = 4
    HANDED_BACK = 5


@dataclass(slots=True)
class Hello:
    """What a worker says when it (re)connects."""

    worker_id: str
    threads: int
    slots: int
    gpus: int = 0
    memory_mb: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    hostname: str = ""
    pid: int = 0
    running: dict[AttemptKey, int] = field(default_factory=dict)
    finished: set[AttemptKey] = field(default_factory=set)
    job_types: list[JobTypeEntry] = field(default_factory=list)
    registered_since: float = 0.0
    """When this worker process first registered (the control plane's time; 0: it never did): what was
    leased to this worker id since then was leased to this process."""


@dataclass(slots=True)
class Report:
    """One attempt's outcome as the worker reports it."""

    job_id: str
    attempt: int
    outcome: Outcome
    result_json: str = ""
    error_code: str = ""
    error_message: str = ""
    started_at: float = 0.0
    finished_at: float = 0.0
    output: str = ""
    """The end of what the attempt printed."""


NOT_RECEIVED = "NOT_RECEIVED"
"""Why an attempt leased to a worker process that never got it (its assignment was lost with a broken
stream, or with a control plane killed before sending it) went back in line."""


def _never_reached(job: jobs.JobRecord, hello: Hello) -> bool:
    """Whether the worker process saying ``hello`` held this worker id when ``job``'s attempt was leased
    (so it would list the attempt had it got it). Both times are the control plane's clock."""
    return 0 < hello.registered_since <= (job.started_at or 0.0)


class WorkerSessions:
    """Register, heartbeat, results, draining and disconnects of worker streams."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.s = scheduler

    def register(self, hello: Hello, link: WorkerLink) -> tuple[list[AttemptKey], list[AttemptKey]]:
        """Connect a worker; returns (adopted, rejected) attempts of those it says it runs."""
        s = self.s
        now = s.clock.now()
        worker = s.registry.get(hello.worker_id)
        if worker is not None and worker.link is not None and worker.link is not link:
            if (worker.hostname, worker.pid) != (hello.hostname, hello.pid):
                # Another process with the same id: taking its place would make the two take turns
                # for ever, each registration killing the jobs of the other.
                raise AlreadyExists(
                    f"worker id {hello.worker_id!r} is in use by a connected worker (host {worker.hostname!r}, "
                    f"pid {worker.pid}): give each worker its own id (CORRAL_WORKER_ID, --worker-id)"
                )
            worker.link.close()  # a newer stream of the same worker process replaces the old one
        for entry_type in hello.job_types:
            if s.catalog.add(entry_type):
                s.store.put_job_type(entry_type, now)
        held: dict[AttemptKey, int] = dict(worker.running) if worker is not None else {}
        # An operator's drain outlives the stream it was sent on, or asked while the worker was away: a
        # reconnection that cleared it gave the worker new jobs, and the drain was silently undone.
        drain_until = worker.drain_until if worker is not None else None
        if worker is None:
            worker = WorkerEntry(hello.worker_id, hello.threads, hello.slots, registered_at=now, last_seen=now)
        worker.heard(s.clock)
        worker.threads, worker.slots = hello.threads, hello.slots
        worker.gpus, worker.memory_mb = hello.gpus, hello.memory_mb
        worker.labels, worker.hostname, worker.pid = hello.labels, hello.hostname, hello.pid
        worker.job_types = frozenset(t.name for t in hello.job_types)
        worker.link, worker.draining = link, drain_until is not None

        adopted: list[AttemptKey] = []
        rejected: list[AttemptKey] = []
        changed: list[jobs.JobRecord] = []
        running: dict[AttemptKey, int] = {}
        needs: dict[AttemptKey, Needs] = {}
        for key, threads in hello.running.items():
            job = s.active.get(key[0])
            try:
                if job is None:
                    raise StaleAttempt(key[0], key[1], "job is finished or unknown")
                moved_worker = job.worker_id != worker.id
                jobs.adopt(job, key[1], worker.id, now, s.config.lease_grace_sec)
                s.track_lease(job)
                running[key] = threads
                needs[key] = needs_of(job)
                adopted.append(key)
                if moved_worker:
                    changed.append(job)
                if key not in held:
                    logger.info(logs.JOB_ADOPTED, extra={"job_id": key[0], "attempt": key[1], "worker_id": worker.id})
            except StaleAttempt:
                rejected.append(key)
                s.actions.reported(key)  # the worker kills it as it reads this answer
        # Attempts leased to this worker that it neither runs nor has a result for are lost. Its entry
        # holds every attempt leased to it (kept while it is away, rebuilt from the store after a
        # restart), so this costs what the worker held, not every running job: a thousand workers
        # reconnecting at once after a restart each walked all their running jobs before.
        for key in held:
            if key in hello.running or key in hello.finished:
                continue
            job = s.active.get(key[0])
            if key in s.dispatcher.unsent and job is not None:
                # Leased, and its lease's commit is under way: not sent on the old stream, so not lost;
                # the assignment goes out on this one.
                running[key], needs[key] = held[key], needs_of(job)
                continue
            s.actions.reported(key)  # not running there: nothing to wait for (a cancel of it)
            if (
                job is not None
                and job.state is JobState.RUNNING
                and job.attempts == key[1]
                and job.worker_id == worker.id
            ):
                if _never_reached(job, hello):
                    before = job.state
                    jobs.hand_back(job, key[1], now)
                    s.moved(job, before)
                    s.log_committed(logs.JOB_REQUEUED, {"job_id": job.id, "attempt": key[1], "reason": NOT_RECEIVED})
                else:
                    s.fail(job, key[1], jobs.WORKER_LOST, f"worker {worker.id} restarted without this attempt")
                changed.append(job)
        s.registry.hold_only(worker, running, needs)
        s.registry.add(worker)
        logger.info(
            logs.WORKER_REGISTERED,
            extra={"worker_id": worker.id, "threads": worker.threads, "slots": worker.slots, "adopted": len(adopted)},
        )
        if drain_until is not None:
            # What is left of its deadline (at least a moment: 0 would mean the worker's own default).
            link.drain(max(MIN_DRAIN_SEC, drain_until - s.clock.monotonic()))
        s.later(changed)
        s.workers_changed()
        return adopted, rejected

    def heard_from(self, worker_id: str) -> WorkerEntry | None:
        """Note a sign of life; returns the worker (None when it was reaped meanwhile)."""
        worker = self.s.registry.get(worker_id)
        if worker is not None:
            worker.heard(self.s.clock)
        return worker

    def results(self, worker_id: str, reports: list[Report], link: WorkerLink) -> None:
        """Apply what a worker reports; acknowledge every report once committed."""
        s = self.s
        worker = self.heard_from(worker_id)
        now = s.clock.now()
        changed: list[jobs.JobRecord] = []
        acks: list[AttemptKey] = []
        logging_info = logger.isEnabledFor(logging.INFO)
        for r in reports:
            key = (r.job_id, r.attempt)
            acks.append(key)
            if worker is not None:
                s.registry.release(worker, key)
            s.actions.reported(key)
            job = s.active.get(r.job_id)
            exec_seconds = max(0.0, r.finished_at - r.started_at) if r.started_at else 0.0
            try:
                if job is None:
                    raise StaleAttempt(r.job_id, r.attempt, "job is finished or unknown")
                before = job.state
                outcome, fault = r.outcome, None
                if outcome is Outcome.SUCCEEDED and (fault := result_fault(r.result_json or "{}")) is not None:
                    # Stored, it would break every read of the job (GetJob, ListJobs, WatchJob) until
                    # retention removed it: a runner checks this itself, but a worker of another
                    # version, or a hostile one, need not have.
                    outcome = Outcome.FAILED
                if outcome is Outcome.SUCCEEDED:
                    jobs.succeed(job, r.attempt, r.result_json or "{}", now, exec_seconds, r.output)
                    s.metrics.job_succeeded(job.type, exec_seconds)
                    s.moved(job, before)
                    if worker is not None:
                        worker.jobs_completed += 1
                    if logging_info:
                        s.log_committed(
                            logs.JOB_COMPLETED,
                            {
                                "job_id": job.id,
                                "attempt": r.attempt,
                                "worker_id": worker_id,
                                "exec_sec": round(exec_seconds, 6),
                                "request_id": job.request_id,
                            },
                        )
                elif outcome is Outcome.HANDED_BACK:
                    jobs.hand_back(job, r.attempt, now)
                    s.moved(job, before)
                    if logging_info:
                        s.log_committed(
                            logs.JOB_REQUEUED, {"job_id": job.id, "attempt": r.attempt, "reason": "HANDED_BACK"}
                        )
                else:
                    jobs.check_attempt(job, r.attempt)
                    if fault is not None:
                        code, message = jobs.ERROR, f"the worker's result cannot be read back: {fault}"
                    else:
                        code = r.error_code or {Outcome.TIMEOUT: jobs.TIMEOUT, Outcome.CANCELLED: jobs.CANCELLED}.get(
                            r.outcome, jobs.ERROR
                        )
                        message = r.error_message
                    s.fail(job, r.attempt, code, message, exec_seconds, r.output)
                    if worker is not None:
                        worker.jobs_failed += 1
                changed.append(job)
            except StaleAttempt as exc:
                logger.info(logs.STALE_RESULT, extra={"job_id": r.job_id, "attempt": r.attempt, "reason": exc.message})
        s.later(changed, lambda: link.ack(acks))
        s.dispatch_soon()

    def printed(self, worker_id: str, job_id: str, attempt: int, offset: int, text: str) -> None:
        """Take what a running attempt printed lately (live output), from the worker that holds its
        lease and for the attempt it holds; anything else (a stale attempt, a worker that lost the job)
        is dropped."""
        job = self.s.active.get(job_id)
        if job is None or job.state is not JobState.RUNNING or job.attempts != attempt or job.worker_id != worker_id:
            return
        self.s.live_output.add(job_id, attempt, offset, text)

    def draining(self, worker_id: str) -> None:
        """The worker announced it is draining: give it nothing new."""
        worker = self.heard_from(worker_id)
        if worker is not None and not worker.draining:
            worker.draining = True
            self.s.registry.changed(worker)
            logger.info(logs.WORKER_DRAINING, extra={"worker_id": worker_id, "by": "worker"})
            self.s.workers_changed()

    def drain(self, worker_id: str, deadline_sec: float) -> WorkerEntry:
        """Operator request: stop giving the worker jobs and ask it to finish and leave."""
        worker = self.s.registry.get(worker_id)
        if worker is None:
            raise NotFound(f"worker {worker_id!r} not found")
        worker.draining = True
        worker.drain_until = self.s.clock.monotonic() + deadline_sec
        if worker.link is not None:
            worker.link.drain(deadline_sec)
        self.s.registry.changed(worker)
        logger.info(logs.WORKER_DRAINING, extra={"worker_id": worker_id, "by": "operator"})
        self.s.workers_changed()
        return worker

    def disconnected(self, worker_id: str, link: WorkerLink) -> None:
        """The stream closed. A drained worker with nothing running leaves now; others wait for the reaper."""
        worker = self.s.registry.get(worker_id)
        if worker is None or worker.link is not link:
            return
        worker.link = None
        self.s.actions.worker_gone(worker)
        if worker.draining and not worker.running:
            self.s.registry.remove(worker_id)
            logger.info(logs.WORKER_LEFT, extra={"worker_id": worker_id})
        else:
            logger.info(logs.WORKER_DISCONNECTED, extra={"worker_id": worker_id, "running": len(worker.running)})
        self.s.registry.changed(worker)
        self.s.workers_changed()
