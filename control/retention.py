"""Retention: finished jobs leave the store some time after they finished, so it does not grow for ever.

``CORRAL_JOB_RETENTION_SEC`` (7 days) applies to SUCCEEDED and CANCELLED jobs,
``CORRAL_FAILED_RETENTION_SEC`` (14 days) to FAILED ones, the dead-letter queue; 0 keeps them. Both are
at least ``IDEMPOTENCY_TTL_SEC`` (the configuration refuses less), so a replayed submission always
finds the job its key made. A job CANCELLED because a job it depended on failed (DEPENDENCY_FAILED) is
kept as long as FAILED ones are: RetryJob of that job brings it back, for as long as that job is kept.

:class:`RetentionSweeper` deletes in steps of at most :data:`PURGE_BATCH` jobs (one short store
transaction each, yielding to the event loop between them), every :func:`sweep_interval` seconds. A
purged job is gone for every read (GetJob and WatchJob answer NOT_FOUND, ListJobs and GetStats no
longer count it) and ``corral_jobs_purged_total{state}`` counts it. The database file stops growing;
it does not shrink (SQLite reuses the freed pages).
"""

from __future__ import annotations

import asyncio
import logging
import math

from control.admission.idempotency import sweep_interval
from control.clock import Clock
from control.jobs import JobState
from control.scheduler import Scheduler
from control.turns import pause
from corral import logs

__all__ = ["PURGE_BATCH", "RetentionSweeper"]

logger = logging.getLogger(__name__)

PURGE_BATCH = 1000
"""Jobs of one state one purge step looks at (and deletes at most)."""


class RetentionSweeper:
    """Deletes finished jobs past their retention (see the module docstring)."""

    def __init__(
        self,
        scheduler: Scheduler,
        clock: Clock,
        *,
        succeeded_sec: float,
        failed_sec: float,
        batch: int = PURGE_BATCH,
    ) -> None:
        self.scheduler = scheduler
        self.clock = clock
        self.batch = batch
        self.keep: dict[JobState, float] = {
            state: seconds
            for state, seconds in (
                (JobState.SUCCEEDED, succeeded_sec),
                (JobState.CANCELLED, succeeded_sec),
                (JobState.FAILED, failed_sec),
            )
            if seconds > 0
        }
        """How long each terminal state is kept (states kept for ever are absent)."""
        self.chain_keep = failed_sec if failed_sec > 0 else math.inf
        """How long a job CANCELLED with DEPENDENCY_FAILED is kept: as long as the FAILED job that may bring
        it back (for ever when those are)."""
        self.interval = sweep_interval(min(self.keep.values())) if self.keep else 0.0
        """Seconds between sweeps: a job outlives its retention by at most about this long."""

    async def sweep(self) -> int:
        """Delete every job past its retention now, ``batch`` at a time; returns how many."""
        total = 0
        for state, keep in self.keep.items():
            after = 0
            while True:
                now = self.clock.now()
                chained = now - self.chain_keep if state is JobState.CANCELLED else None
                step = await self.scheduler.purge(
                    state, now - keep, self.batch, after, dependency_failed_before=chained
                )
                total += len(step.ids)
                if step.next_seq is None:
                    break
                after = step.next_seq
                await pause()  # let submissions and results in between two steps
        if total:
            logger.info(logs.JOBS_PURGED, extra={"jobs": total})
        return total

    async def run(self) -> None:
        """Sweep every ``interval`` seconds until cancelled (returns at once when every state is kept)."""
        if not self.keep:
            return
        while True:
            try:
                await self.sweep()
            except Exception:  # a failed sweep must not stop later ones
                logger.exception("job_purge_failed")
            await asyncio.sleep(self.interval)
