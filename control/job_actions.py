"""Cancel and retry: what callers do to jobs already submitted, one at a time or by the thousand.

CancelJob ends an unfinished job at once: a queued one never runs, a running one's process is stopped
by its worker once the cancel is committed. CancelJob then answers once that worker has reported the
attempt ended (its process gone), or is gone itself, or CANCEL_CONFIRM_SEC passed: an assignment already
on its way to the worker may start the job's process before the cancel reaches it, and an answer at the
commit alone let a job start after its cancel was acknowledged. RetryJob re-drives a FAILED job (from
the dead-letter queue) under a fresh attempt count, and brings back what its failure cancelled down a
dependency chain (control.dependencies). CancelJobs and RetryJobs do the same for every job a selection
matches (control.selection), oldest first and up to a limit, in chunks that let other calls in between.

Every change goes through ``control.jobs`` and the scheduler's commit, like any other: nothing is
announced before it is committed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from control import jobs
from control.jobs import JobRecord, JobState
from control.registry import AttemptKey, WorkerEntry
from control.selection import JobSelection
from control.store import JobPage
from control.turns import in_turns
from corral import logs
from corral.errors import FailedPrecondition

if TYPE_CHECKING:
    from control.scheduler import Scheduler

__all__ = ["CANCEL_CHUNK", "CANCEL_CONFIRM_SEC", "JobActions"]

logger = logging.getLogger(__name__)

CANCEL_CHUNK = 250
"""Jobs one CancelJobs transaction cancels; a loop turn goes between chunks (a call that waits behind a
cancel of 10,000 jobs needs several turns to be answered: `bench cancel_many`'s ``other_get_p99_ms``)."""
CANCEL_CONFIRM_SEC = 2.0
"""The longest CancelJob waits for the worker of a running job to report it stopped (less when
WORKER_HEARTBEAT_TIMEOUT_SEC is less): a worker that does not answer in that time is hung or gone, and
the cancel is answered anyway."""


class JobActions:
    """Cancel and retry, on the scheduler's live jobs; see the module docstring."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.s = scheduler
        self._stopping: dict[AttemptKey, asyncio.Future[None]] = {}
        """Cancelled attempts whose worker was told to stop them, until it reports them ended
        (:meth:`reported`) or is gone (:meth:`worker_gone`): CancelJob waits for that."""

    def reported(self, key: AttemptKey) -> None:
        """A worker reported the attempt ``key`` ended (whatever its outcome): its process is gone."""
        waiter = self._stopping.pop(key, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def worker_gone(self, worker: WorkerEntry) -> None:
        """``worker`` left, was lost or its stream closed: none of its attempts will be reported soon."""
        for key in worker.running:
            self.reported(key)

    async def cancel(self, job_id: str) -> JobRecord:
        """Cancel the unfinished job ``job_id``; returns it once the cancel is committed.

        Raises:
            NotFound: no such job.
            FailedPrecondition: it has finished already.
        """
        job = self.s.active.get(job_id)
        if job is not None and job.state.terminal:  # its end is on its way to the store: answer as committed
            await self.s.get(job_id)
            job = self.s.active.get(job_id)
        if job is None or job.state.terminal:
            found = await self.s.get(job_id)
            raise FailedPrecondition(f"job {job_id!r} is {found.state.name}; only unfinished jobs can be cancelled")
        stopping = await self._cancel_now([job], confirm=True)
        if stopping:
            # The worker stops the process once the cancel reaches it; an assignment sent before the
            # cancel may start it meanwhile. Answer once that is over (or the worker counts as lost).
            try:
                within = min(CANCEL_CONFIRM_SEC, self.s.config.heartbeat_timeout_sec)
                await asyncio.wait(stopping, timeout=within)
            finally:
                for key, waiter in list(self._stopping.items()):
                    if waiter in stopping and not waiter.done():  # not reported in time: wait no more
                        del self._stopping[key]
        return job

    async def cancel_matching(
        self,
        selection: JobSelection,
        limit: int,
        job_ids: Sequence[str] | None = None,
        check: Callable[[JobRecord], object] | None = None,
    ) -> tuple[list[str], int]:
        """Cancel the unfinished jobs ``selection`` matches (among ``job_ids`` when given), at most
        ``limit``, oldest first; returns the ids cancelled and how many more matched.

        Each chunk of :data:`CANCEL_CHUNK` jobs is one transaction, with a loop turn between chunks, so
        that a large cancel does not hold up dispatch and other calls. ``check`` is called with each job
        ``job_ids`` names before anything changes (access rules: it raises to refuse).

        Raises:
            NotFound: an id of ``job_ids`` that names no job.
        """
        if job_ids is None:
            candidates: Iterable[JobRecord] = self.s.active.values()
        else:
            named = await self._named(job_ids, check)
            candidates = (self.s.active[job.id] for job in named if job.id in self.s.active)
        matched = sorted((job for job in candidates if selection.matches(job)), key=_by_seq)
        chosen, remaining = matched[:limit], max(len(matched) - limit, 0)
        cancelled: list[str] = []
        async for _, chunk in in_turns(chosen, CANCEL_CHUNK):
            # Another call may have moved a job on meanwhile (ended it, or cancelled it itself).
            part = [job for job in chunk if self._unfinished(job)]
            if part:
                await self._cancel_now(part)
                cancelled.extend(job.id for job in part)
        return cancelled, remaining

    async def retry_matching(
        self,
        selection: JobSelection,
        limit: int,
        job_ids: Sequence[str] | None = None,
        check: Callable[[JobRecord], object] | None = None,
    ) -> tuple[list[str], int]:
        """Re-drive the FAILED jobs ``selection`` matches (among ``job_ids`` when given), at most
        ``limit``, oldest first, each as :meth:`retry` does (a transaction of its own); returns the ids
        retried and how many more matched. ``check`` as for :meth:`cancel_matching`.

        Raises:
            NotFound: an id of ``job_ids`` that names no job.
        """
        if job_ids is not None:
            named = await self._named(job_ids, check)
            matched = sorted((j for j in named if j.state is JobState.FAILED and selection.matches(j)), key=_by_seq)
            chosen, remaining = [j.id for j in matched[:limit]], max(len(matched) - limit, 0)
        else:  # from the store, where every FAILED job is (newest first): the oldest are the page at the end

            async def page_at(offset: int) -> JobPage:
                return await self.s.list_jobs(
                    [JobState.FAILED],
                    selection.job_type,
                    limit,
                    offset,
                    sorted(selection.owners),
                    selection.labels,
                    error_code=selection.error_code,
                )

            page = await page_at(0)
            if page.total > limit:  # one read when they all fit in one page
                page = await page_at(page.total - limit)
            # A page may hold fewer than ``limit`` (large payloads): what it left out still remains.
            chosen, remaining = [j.id for j in reversed(page.jobs)], page.total - len(page.jobs)
        retried: list[str] = []
        for job_id in chosen:
            try:
                await self.retry(job_id)
            except FailedPrecondition:  # another call re-drove it meanwhile
                continue
            retried.append(job_id)
        return retried, remaining

    async def _named(self, job_ids: Sequence[str], check: Callable[[JobRecord], object] | None) -> list[JobRecord]:
        """The jobs ``job_ids`` name, each passed to ``check`` (it raises to refuse one) before any
        changes; NotFound for an id that names no job."""
        named = await self.s.get_many(job_ids)
        if check is not None:
            for job in named:
                check(job)
        return named

    def _unfinished(self, job: JobRecord) -> bool:
        return self.s.active.get(job.id) is job and not job.state.terminal

    async def _cancel_now(self, chosen: list[JobRecord], confirm: bool = False) -> list[asyncio.Future[None]]:
        """Cancel ``chosen`` (live, unfinished) in one transaction; once it is committed, stop their
        running attempts and tell their watchers. With ``confirm``: returns a future for each attempt a
        worker was told to stop, done once it reports that attempt ended or is gone."""
        stopping: list[asyncio.Future[None]] = []
        now = self.s.clock.now()
        was: list[tuple[JobRecord, JobState, int, str]] = []
        for job in chosen:
            attempt, worker_id = job.attempts, job.worker_id
            before = jobs.cancel(job, now)
            self.s.moved(job, before)
            if before is JobState.PENDING and self.s.exec_limits is not None:
                self.s.exec_limits.discard(job.id)  # it may be parked by an execution limit
            was.append((job, before, attempt, worker_id))
        self.s.write(chosen)

        def stop_and_tell() -> None:
            for job, before, attempt, worker_id in was:
                logger.info(logs.JOB_CANCELLED, extra={"job_id": job.id, "was": before.name})
                if before is JobState.RUNNING:
                    worker = self.s.registry.get(worker_id)
                    if worker is not None and worker.link is not None:
                        worker.link.cancel(job.id, attempt)
                        key = (job.id, attempt)
                        if confirm and key in worker.running:
                            waiter = self._stopping.get(key)
                            if waiter is None:
                                waiter = self._stopping[key] = asyncio.get_running_loop().create_future()
                            stopping.append(waiter)
                self.s.tell(job)

        # Not after the await: a caller gone meanwhile would leave a cancelled job's process running,
        # its watchers waiting and its record live.
        self.s.on_commit(stop_and_tell)
        await self.s.commit()
        return stopping

    async def retry(self, job_id: str) -> JobRecord:
        """Re-drive the FAILED job ``job_id``, and what its failure cancelled down the chain; returns
        it, PENDING under a fresh attempt count, once committed.

        Raises:
            NotFound: no such job.
            FailedPrecondition: it is not FAILED.
        """
        if job_id in self.s.unsettled:  # a change on its way to the store (its failure): answer as committed
            await self.s.get(job_id)
        if job_id in self.s.active:
            job = self.s.active[job_id]
            raise FailedPrecondition(f"job {job_id!r} is {job.state.name}; only FAILED jobs can be retried")
        async with self.s.rewrites:
            # What its failure cancelled down the chain, all of it, stored and no longer live: the chain
            # is read from the store, and only jobs not live are brought back.
            await self.s.dependencies.settled()
            await self.s.commit()
            job = await self.s.get(job_id)
            if job_id in self.s.active:  # raced with another retry while reading
                raise FailedPrecondition(
                    f"job {job_id!r} is {self.s.active[job_id].state.name}; only FAILED jobs can be retried"
                )
            if job.state is not JobState.FAILED:
                raise FailedPrecondition(f"job {job_id!r} is {job.state.name}; only FAILED jobs can be retried")
            chain = await self.s.dependencies.cancelled_chain(job_id)
            self.s.recent.discard(job_id)  # live again: reads must see the record as it changes
            now = self.s.clock.now()
            jobs.redrive(job, now)
            self.s.active[job.id] = job
            self.s.counts[JobState.FAILED] -= 1
            self.s.counts[job.state] += 1
            self.s.enqueue(job)
            revived = self.s.dependencies.revive(job, chain, now)
            self.s.write([job, *revived])

            def tell() -> None:
                self.s.metrics.job_redriven(job.type)
                logger.info(
                    logs.JOB_RETRIED,
                    extra={"job_id": job.id, "attempts": job.attempts, "revived": [r.id for r in revived]},
                )
                for changed in (job, *revived):
                    self.s.tell(changed)

            self.s.on_commit(tell)  # as for a cancel: told even if the caller has gone
            await self.s.commit()
        return job


def _by_seq(job: JobRecord) -> int:
    return job.seq
