"""Reaper: finds lost workers and expired leases and puts their jobs back in line.

A worker is lost when nothing was heard from it for WORKER_HEARTBEAT_TIMEOUT_SEC, whether its
stream is still open (hung) or closed (crashed and did not come back). Each attempt it held is a
failed attempt with reason WORKER_LOST. A lease is expired at its job's deadline plus the lease
grace, for a worker that is alive but did not kill its job: the attempt fails with LEASE_EXPIRED
and the worker is told to cancel it.

Time the control plane itself stood still (stopped, frozen with its container or VM, its event loop
blocked) is nobody's silence: the heartbeats of that time wait unread in its sockets. A sweep that
runs late by more than PAUSE_SEC moves every worker's last-heard time and every running lease on by
the delay (:meth:`Reaper.forgive`) before it judges anyone.
"""

from __future__ import annotations

import asyncio
import logging

from control import jobs
from control.jobs import JobRecord, JobState
from control.scheduler import Scheduler
from corral import logs

logger = logging.getLogger(__name__)

CLOCK_STEP_SEC = 1.0
"""A change of (system time - monotonic time) between two sweeps larger than this is a step of the clock."""
PAUSE_SEC = 1.0
"""A sweep this much later than planned means the control plane stood still meanwhile (see the module)."""


class Reaper:
    """Periodic sweep; ``sweep()`` is also called directly by tests."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.s = scheduler
        timeout = scheduler.config.heartbeat_timeout_sec
        self.interval = max(0.05, min(1.0, timeout / 4))
        self.reaped = 0
        self._skew: float | None = None  # system time minus monotonic time at the last sweep

    async def run(self) -> None:
        """Sweep every :attr:`interval` seconds until cancelled, first forgiving a delay past PAUSE_SEC
        (:meth:`forgive`); a sweep that fails is logged and the next one runs as planned."""
        loop = asyncio.get_running_loop()
        while True:
            planned = loop.time() + self.interval
            await asyncio.sleep(self.interval)
            try:
                late = loop.time() - planned
                if late > PAUSE_SEC:
                    self.forgive(late)
                self.sweep()
            except Exception:  # a bug here must not stop reaping for good
                logger.exception("reaper_failed")

    def sweep(self) -> None:
        """Remove the workers silent past the heartbeat timeout (each attempt they held fails with WORKER_LOST);
        then, leases moved by any step of the system clock, fail those that expired (LEASE_EXPIRED; the
        worker is told to cancel). The jobs are persisted and announced once committed (:meth:`Scheduler.later`)."""
        s = self.s
        now = s.clock.now()
        steady = s.clock.monotonic()
        changed: list[JobRecord] = []
        timeout = s.config.heartbeat_timeout_sec
        for worker in s.registry.all():
            if steady - worker.heard_at <= timeout:
                continue
            s.registry.remove(worker.id)
            s.actions.worker_gone(worker)
            self.reaped += 1
            logger.warning(
                logs.WORKER_STALE,
                extra={
                    "worker_id": worker.id,
                    "silent_sec": round(steady - worker.heard_at, 3),
                    "jobs": len(worker.running),
                },
            )
            if worker.link is not None:
                worker.link.close()
                worker.link = None
            for job_id, attempt in worker.running:
                job = s.active.get(job_id)
                if job is not None and job.state is JobState.RUNNING and job.attempts == attempt:
                    s.fail(job, attempt, jobs.WORKER_LOST, f"worker {worker.id} was lost")
                    changed.append(job)
            s.workers_changed()
        self._follow_clock_steps(now, steady)
        stop: list[tuple[str, str, int]] = []
        for job in s.expired_leases(now):
            attempt = job.attempts
            logger.warning(logs.LEASE_EXPIRED, extra={"job_id": job.id, "attempt": attempt, "worker_id": job.worker_id})
            stop.append((job.worker_id, job.id, attempt))
            s.fail(job, attempt, jobs.LEASE_EXPIRED, f"lease expired on worker {job.worker_id}")
            changed.append(job)

        def tell_holders() -> None:  # once committed: a crash before then would leave the attempt alive
            for worker_id, job_id, attempt in stop:
                holder = s.registry.get(worker_id)
                if holder is not None and holder.link is not None:
                    holder.link.cancel(job_id, attempt)

        if changed:
            s.later(changed, tell_holders if stop else None)

    def forgive(self, seconds: float) -> None:
        """The control plane stood still for ``seconds`` and heard no one: count none of it as a
        worker's silence or against a lease."""
        s = self.s
        steady = s.clock.monotonic()
        workers = s.registry.all()
        logger.warning(
            logs.CONTROL_PAUSED, extra={"seconds": round(seconds, 3), "workers": len(workers), "leases": len(s.running)}
        )
        for worker in workers:
            worker.heard_at = min(steady, worker.heard_at + seconds)
        self._shift_leases(seconds)

    def _follow_clock_steps(self, now: float, steady: float) -> None:
        """Leases end at a system time; when that time steps (more than a second between two
        sweeps; NTP's slewing moves it by far less), move every running lease by the step."""
        skew = now - steady
        step = 0.0 if self._skew is None else skew - self._skew
        self._skew = skew
        if abs(step) <= CLOCK_STEP_SEC:
            return
        logger.warning(logs.CLOCK_STEPPED, extra={"seconds": round(step, 3), "leases": len(self.s.running)})
        self._shift_leases(step)

    def _shift_leases(self, seconds: float) -> None:
        for job_id in self.s.running:
            jobs.shift_lease(self.s.active[job_id], seconds)
        self.s.leases_moved()
