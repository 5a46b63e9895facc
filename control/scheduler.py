"""Scheduler: the control plane's core. It owns the live jobs, the queues and the worker registry.

All of its state lives on one asyncio event loop, so every check-then-change (a compare-and-set on
``(job id, attempt)``) is atomic. Changes are made in memory through ``control.jobs``, queued to the
store at once, and acknowledged or announced only after the store has committed them: a client, a
worker or a watcher never hears of a change that a crash could undo. Many changes share one commit.

Reads, the commits that many changes share and the timer of delayed jobs are here. Elsewhere:

* new jobs come in through ``control.intake``;
* the dispatch pass, which leases ready jobs to workers, is ``control.dispatch``;
* cancel and retry are ``control.job_actions``;
* the worker side (register, results, disconnects) is ``control.sessions``;
* lost workers and expired leases are ``control.reaper``;
* jobs that wait for others are ``control.dependencies``, owners' shares of the workers
  ``control.shares``;
* the streams that follow a job's changes and what it prints (WatchJob, RunJob, WatchOutput) are
  ``control.feeds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from control import jobs
from control.access import Access, not_found, parse_groups
from control.admission import (
    IdempotencyKeys,
    JobTypeCatalog,
    Limits,
)
from control.admission.idempotency import MAX_CACHED_KEYS
from control.admission.ratelimit import SubmitRateLimiter
from control.backoff import retry_delay
from control.clock import Clock
from control.config import ControlConfig
from control.dependencies import Dependencies
from control.dispatch import POLICIES, Dispatcher, needs_of
from control.exec_limits import ExecLimits, parse_exec_limits
from control.feeds import JobFeeds
from control.intake import Intake
from control.job_actions import JobActions
from control.jobs import JobRecord, JobState
from control.live_output import LiveOutput
from control.metrics import Metrics
from control.notify.notices import Notices
from control.queue import DelayedQueue, LeaseQueue, QueueOrder, ReadyQueue
from control.queue_view import DrainRate, QueuePage, queue_page
from control.recent import RecentJobs
from control.registry import Capacity, WorkerEntry, WorkerRegistry
from control.shares import OwnerQueues, OwnerUsage, ShareRow, ShareRules
from control.store import JobPage, PurgeStep, Store
from control.turns import in_turns, pause
from control.unsettled import Unsettled
from control.watch import Watchers
from corral import logs

logger = logging.getLogger(__name__)

LEASE_SLACK = 1024
"""Stale entries the lease queue may hold beyond twice the running jobs before it is rebuilt."""
PROMOTE_CHUNK = 500
"""Due SCHEDULED jobs made PENDING in one loop turn (one transaction); the rest follow turn by turn."""
SCAN_CHUNK = 10_000
"""Live jobs looked at per loop turn by a walk over all of them (ListShares counts the queued ones):
about a millisecond each."""


class Scheduler:
    """Live jobs, queues and workers; see the module docstring."""

    def __init__(self, store: Store, config: ControlConfig, clock: Clock, rng: random.Random | None = None) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        self.rng = rng or random.Random(config.backoff_seed)
        self.limits = Limits(config.max_payload_bytes, config.max_batch)
        group_of = parse_groups(config.groups)
        self.access = Access.of(config.job_visibility, config.auth_admins, group_of)
        """Who may see which jobs (control.access)."""
        self.catalog = JobTypeCatalog(store.load_job_types())
        live_keys = store.load_idempotency(clock.now(), MAX_CACHED_KEYS)
        self.idempotency = IdempotencyKeys(
            config.idempotency_ttl_sec,
            live_keys,
            fetch=store.get_idempotency,
            complete=len(live_keys) < MAX_CACHED_KEYS,
            read=store.read_idempotency,
        )
        self.submit_limits = SubmitRateLimiter(
            clock,
            config.rate_limit_jobs_per_min,
            config.rate_limit_burst,
            config.rate_limit_per_client_jobs_per_min,
            config.rate_limit_per_client_burst,
        )
        rules = parse_exec_limits(config.exec_rate_limits)
        self.exec_limits = (
            ExecLimits(rules, clock, self._released, lambda target: self.metrics.exec_rate_delayed.labels(target).inc())
            if rules
            else None
        )
        """Execution rate limits (CORRAL_EXEC_RATE_LIMITS), None when there are none."""
        self.registry = WorkerRegistry()
        self.watchers = Watchers()
        self.live_output = LiveOutput()
        """What running jobs print, for WatchOutput (control.live_output)."""
        self.feeds = JobFeeds(
            self.watchers, self.live_output, self.get, self.get_many, lambda job_id: job_id in self.unsettled
        )
        """The streams of each job's committed changes and of what it prints (control.feeds)."""
        self.active: dict[str, JobRecord] = {}
        self.recent = RecentJobs()
        """Jobs that finished lately (control.recent): read without a store query."""
        self.running: set[str] = set()
        self.leases = LeaseQueue()
        """Where the running jobs' leases end (see :meth:`expired_leases`)."""
        self.counts: Counter[JobState] = Counter(store.count_by_state())
        self.shares = ShareRules.parse(
            config.fair_share, config.owner_weights, config.owner_max_running, group_of, config.fair_share_half_life_sec
        )
        self.usage = OwnerUsage(self.shares.group_of, self.shares.half_life_sec, self.clock.monotonic)
        """Each owner's running jobs and threads, and the thread-seconds it used (control.shares)."""
        self.order = QueueOrder(config.priority_aging_sec)
        """How ready jobs are ranked: priority, then age; with CORRAL_PRIORITY_AGING_SEC, waiting raises it."""
        self.ready: ReadyQueue | OwnerQueues = (
            OwnerQueues(
                self._is_queued, self._looks_queued, self.shares, self.usage, self.order, self.registry.capacity
            )
            if self.shares.per_owner
            else ReadyQueue(self._is_queued, self.order)
        )
        self.delayed = DelayedQueue()
        self.drain = DrainRate()
        """Recent starts: the rate the queue view's estimated starts go by."""
        self.started_at = time.time()
        self.on_change: Callable[[], None] = lambda: None
        """Called when readiness may have changed (a worker came, left or started draining)."""
        self.metrics = Metrics()
        """Event counters and histograms (control.metrics); the ControlPlane puts in its own."""
        self._queued: dict[str, int] = {}
        self.dependencies = Dependencies(self)
        """The jobs that wait for others to end (control.dependencies)."""
        self.notices = Notices(self)
        """The notification jobs that jobs' ends make (control.notify)."""
        self._dispatch_pending = False
        self._flush_pending = False
        self._after_commit: list[Callable[[], None]] = []
        self.unsettled = Unsettled()
        """The live jobs whose last change is not committed yet: reads of them wait for its commit."""
        self._timer_wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self.rewrites = asyncio.Lock()
        """Held by RetryJob, which reads a finished job and then writes it back live, and by purges: a
        purge in between would delete the row it then updates (the job would live in memory only)."""
        self.intake = Intake(self, store.max_seq())
        """Submissions: admitted, stored and queued (control.intake)."""
        self.actions = JobActions(self)
        """Cancel and retry, of one job or of many (control.job_actions)."""
        self.dispatcher = Dispatcher(self, POLICIES[config.selection]())
        """The dispatch pass, and the jobs it set aside for want of a worker (control.dispatch)."""

    # ---- start-up: rebuild memory from the store --------------------------------------------------
    def recover(self) -> None:
        """Load live jobs; RUNNING ones stay leased to their (not yet reconnected) workers."""
        now = self.clock.now()
        blocked: list[JobRecord] = []
        for job in self.store.load_active():
            self.active[job.id] = job
            if job.state is JobState.PENDING:
                self.enqueue(job)
            elif job.state is JobState.SCHEDULED:
                if job.depends_on:
                    blocked.append(job)
                else:
                    self.delayed.push(job.id, job.ready_at)
            elif job.state is JobState.RUNNING:
                self.running.add(job.id)
                self.usage.started(job)
                if job.lease_expires_at is not None:
                    # The time this process was down is nobody's silence (as a pause is, control.reaper):
                    # its worker may have finished the attempt meanwhile and be on its way back with the
                    # result. It has until the reaper would call it lost to come back; then its adoption
                    # sets the lease anew (control.jobs.adopt), or its result ends the attempt.
                    floor = now + self.config.heartbeat_timeout_sec + self.config.lease_grace_sec
                    job.lease_expires_at = max(job.lease_expires_at, floor)
                self.track_lease(job)
                ghost = self.registry.get(job.worker_id)
                if ghost is None:
                    # Known only from the store: reaped if it does not reconnect in time.
                    ghost = WorkerEntry(job.worker_id, threads=0, slots=0, registered_at=now, last_seen=now)
                    ghost.heard(self.clock)
                    self.registry.add(ghost)
                self.registry.hold(ghost, (job.id, job.attempts), job.threads_granted, needs_of(job))
        if blocked:
            self.dependencies.recover(blocked)
        if self.active:
            logger.info(
                "recovered",
                extra={"jobs": len(self.active), "running": len(self.running), "workers": len(self.registry)},
            )

    def spawn(self, coro: asyncio.Future[None] | asyncio.Task[None] | object) -> None:
        """Run a background coroutine, keeping a reference until it ends."""
        task: asyncio.Task[None] = asyncio.ensure_future(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- commits --------------------------------------------------------------------------------
    def later(self, changed: Sequence[JobRecord], then: Callable[[], None] | None = None, first: bool = False) -> None:
        """Persist ``changed`` and, once committed, announce them and run ``then``.

        ``first``: run ``then`` before everything else that waited for the same commit; the
        announcements keep their order, this call's included. Assignments go out that way: a worker's
        slot stays idle until its assignment arrives, and watchers woken first would have their answers
        written ahead of it (measured with ``python -m bench cpu``, where every result releases the
        next job: see ``hops_ms``)."""
        if changed:
            self.write(changed)
        snapshot = list(changed)
        after = None if first else then

        def done() -> None:
            for job in snapshot:
                self.tell(job)
            if after is not None:
                after()

        if first and then is not None:
            self._after_commit.insert(0, then)
        self._after_commit.append(done)
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._flush)

    def write(self, changed: Sequence[JobRecord]) -> None:
        """Queue ``changed`` to the store, for the next commit; until it ends, reads of them wait for it."""
        self.store.update(changed)
        self.unsettled.wrote(changed)

    def on_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the writes queued so far are committed, by whichever commit covers them:
        even when the caller that awaits that commit has gone by then (a client's deadline, a closed
        stream), what must follow the change (a worker told to stop, watchers told) still does."""
        self._after_commit.append(callback)

    async def commit(self) -> None:
        """Commit what is queued now, then at once run the after-commit work that the commit covers:
        the announcements and assignments of this loop turn go out now, not a turn later."""
        covered, self._after_commit = self._after_commit, []  # all queued their writes before this commit
        settled = self.unsettled.taking()
        if self.store.commit_now():
            settled()
            for cb in covered:
                cb()
            return
        # The commit suspends (sync=full, PostgreSQL). It covers other calls' changes too, so a caller
        # cancelled meanwhile (a client's deadline, a closed stream) must not cut the work after it.
        task = asyncio.ensure_future(self._commit_covering([settled, *covered]))
        self._tasks.add(task)
        task.add_done_callback(self._commit_settled)
        await asyncio.shield(task)

    async def _commit_covering(self, covered: list[Callable[[], None]]) -> None:
        await self.store.commit()
        for cb in covered:
            cb()

    def _commit_settled(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # raised to its caller, or, if the caller had gone, logged by the store

    def _flush(self) -> None:
        self.dispatch_now()  # leases made this turn join the same transaction
        self._flush_pending = False
        callbacks, self._after_commit = self._after_commit, []
        settled = self.unsettled.taking()
        try:
            committed = self.store.commit_now()
        except Exception:
            logger.exception("commit_failed")
            return
        if not committed:
            self.spawn(self._commit_then([settled, *callbacks]))
            return
        settled()
        for cb in callbacks:
            cb()

    async def _commit_then(self, callbacks: list[Callable[[], None]]) -> None:
        try:
            await self.store.commit()
        except Exception:
            logger.exception("commit_failed")
            return
        for cb in callbacks:
            cb()

    def tell(self, job: JobRecord) -> None:
        """Once a change of ``job`` is committed: tell its watchers, and retire it if it has finished. Not
        if it has changed again since, which is not committed yet: the commit of that change tells (a
        watcher told CANCELLED by a lease's commit, with the cancel's own commit still under way, would
        have been told what a crash could undo)."""
        if job.id in self.unsettled:
            return
        self.watchers.announce(job)
        if job.state.terminal:
            self._retire(job)

    def _retire(self, job: JobRecord) -> None:
        """A committed, finished job leaves the live set for the recently finished ones."""
        if self.active.get(job.id) is job:
            del self.active[job.id]
            self.recent.add(job)

    # ---- bookkeeping after a transition ---------------------------------------------------------
    def moved(self, job: JobRecord, before: JobState) -> None:
        """Update counts and queues after ``job`` left ``before``."""
        after = job.state
        if after is before:
            return
        self.counts[before] -= 1
        self.counts[after] += 1
        if before is JobState.RUNNING:
            self.running.discard(job.id)
            self.usage.stopped(job)
            self.live_output.stopped(job.id)
            # Its owner runs one job fewer (CORRAL_OWNER_MAX_RUNNING), so a job held back for that may
            # start now, whatever ended this one: a result asks for a pass, but a reaped or cancelled
            # attempt frees no slot until its worker says so, and may never.
            self.dispatch_soon()
        if after is JobState.PENDING:
            self.enqueue(job)
        elif after is JobState.SCHEDULED:
            self.delayed.push(job.id, job.ready_at)
            self._timer_wake.set()
        elif after is JobState.RUNNING:
            self.running.add(job.id)
            self.usage.started(job)
            self.track_lease(job)
        if after.terminal:
            if after is JobState.CANCELLED:
                self.metrics.job_cancelled(job.type)
            if job.notify:
                self.notices.ended(job)
            if job.id in self.dependencies.waiters:
                self.dependencies.ended(job.id, after)

    # ---- leases ---------------------------------------------------------------------------------
    def track_lease(self, job: JobRecord) -> None:
        """Note where a RUNNING job's lease ends now (after a lease, an adoption)."""
        if job.lease_expires_at is not None:
            self.leases.push(job.lease_expires_at, job.id, job.attempts)
            if len(self.leases) > 2 * len(self.running) + LEASE_SLACK:  # mostly finished jobs' entries
                self.leases_moved()

    def leases_moved(self) -> None:
        """Every running lease may have moved (a clock step, a pause): index them again."""
        live = (self.active[job_id] for job_id in self.running)
        self.leases.rebuild((j.lease_expires_at, j.id, j.attempts) for j in live if j.lease_expires_at is not None)

    def expired_leases(self, now: float) -> list[JobRecord]:
        """The RUNNING jobs whose lease ended before ``now`` (their attempt is the leased one)."""
        expired: dict[str, JobRecord] = {}
        for job_id, attempt in self.leases.pop_due(now):
            job = self.active.get(job_id)
            if job is None or job.state is not JobState.RUNNING or job.attempts != attempt:
                continue  # finished, or leased again since: the entry is stale
            ends = job.lease_expires_at
            if ends is not None and ends < now:
                expired[job_id] = job
            elif ends is not None:
                self.leases.push(ends, job_id, attempt)  # moved later since (an adoption): keep watching
        return list(expired.values())

    def fail(
        self, job: JobRecord, attempt: int, code: str, message: str, exec_seconds: float = 0.0, output: str = ""
    ) -> None:
        """Charge a failed attempt: retry after the backoff, or FAILED. The caller persists ``job``."""
        before = job.state
        delay = retry_delay(attempt, base=self.config.backoff_base_sec, cap=self.config.backoff_cap_sec, rng=self.rng)
        retry = jobs.fail_attempt(job, attempt, code, message, self.clock.now(), delay, exec_seconds, output)
        self.metrics.attempt_failed(job.type, code, retry)
        self.moved(job, before)
        if not logger.isEnabledFor(logging.INFO):
            return
        extra = {"job_id": job.id, "attempt": attempt, "reason": code}
        if retry:
            extra["delay_sec"] = round(delay, 3)
        extra["request_id"] = job.request_id
        self.log_committed(logs.JOB_RETRY_SCHEDULED if retry else logs.JOB_FAILED, extra)

    def log_committed(self, event: str, extra: dict[str, object]) -> None:
        """Log ``event`` (at info level) once the writes queued so far are committed: a line for a change a
        failed commit undid would say it happened (a job completed twice in the log, after a disk full)."""
        self.on_commit(functools.partial(logger.info, event, extra=extra))

    def enqueue(self, job: JobRecord) -> None:
        """Put a PENDING job in the ready queue, and have a dispatch pass run."""
        self._queued[job.id] = self.ready.push(job.id, job.priority, job.ready_at, job.seq, job.owner)
        self.dispatch_soon()

    def requeue(self, job: JobRecord) -> bool:
        """Put a PENDING job that was set aside back in the ready queue, unless it is there already;
        for a dispatch pass, which then places it (it asks for no other pass)."""
        if job.id in self._queued:
            return False
        self._queued[job.id] = self.ready.push(job.id, job.priority, job.ready_at, job.seq, job.owner)
        return True

    def _released(self, job_ids: list[str]) -> None:
        """An execution limit let these parked jobs go: back to the ready queue, in their old place."""
        for job_id in job_ids:
            job = self.active.get(job_id)
            if job is not None and job.state is JobState.PENDING:
                self.enqueue(job)

    def _is_queued(self, job_id: str, token: int) -> bool:
        if self._queued.get(job_id) != token:
            return False
        del self._queued[job_id]
        job = self.active.get(job_id)
        return job is not None and job.state is JobState.PENDING

    def _looks_queued(self, job_id: str, token: int) -> bool:
        """:meth:`_is_queued` without taking the entry (control.shares looks before it chooses)."""
        if self._queued.get(job_id) != token:
            return False
        job = self.active.get(job_id)
        return job is not None and job.state is JobState.PENDING

    # ---- reads ----------------------------------------------------------------------------------
    async def get(self, job_id: str) -> JobRecord:
        """The job ``job_id``: the live record if it is unfinished or finished lately, else read from
        the store. Either way as committed: a change still on its way to the store is waited for, since a
        crash before its commit would undo what the caller saw.

        Raises:
            NotFound: no such job.
            Unavailable: the store cannot be written, so the job's last change cannot be committed.
        """
        while job_id in self.unsettled:
            await self.commit()
        job = self.active.get(job_id)
        if job is None:
            job = self.recent.get(job_id)
        if job is None:
            job = await self.store.get(job_id)
        if job is None:
            raise not_found(job_id)
        return job

    async def get_many(self, job_ids: Sequence[str]) -> list[JobRecord]:
        """The jobs ``job_ids`` name, in that order: from memory where they are, the rest in one read.

        Unlike :meth:`get`, it does not wait for commits: among many jobs, some are nearly always
        changing, and waiting until none is would wait for most of them to end. A record here may carry a
        change not committed yet (``in self.unsettled``): a caller that shows one must wait for its
        commit's announcement instead (``control.feeds``).

        Raises:
            NotFound: the first id that names no job.
        """
        stored: dict[str, JobRecord | None] = {}  # read from the store (None: not there)
        while True:
            found: list[JobRecord] = []
            unread: list[str] = []
            for job_id in job_ids:
                job = self.active.get(job_id) or self.recent.get(job_id) or stored.get(job_id)
                if job is not None:
                    found.append(job)
                elif job_id in stored:
                    raise not_found(job_id)
                else:
                    unread.append(job_id)
            if not unread:
                return found
            # Then look again: one may have been retired during the read, and not kept among the
            # recent ones, so that it is found in none of the three.
            read = {job.id: job for job in await self.store.get_many(unread)}
            stored.update((job_id, read.get(job_id)) for job_id in unread)

    async def list_jobs(
        self,
        states: Sequence[JobState],
        job_type: str,
        limit: int,
        offset: int,
        owners: Sequence[str] = (),
        labels: Mapping[str, str] | None = None,
        *,
        error_code: str = "",
    ) -> JobPage:
        """A page of stored jobs, newest first, with the total that match (see ``Store.list_jobs``)."""
        return await self.store.list_jobs(states, job_type, limit, offset, owners, labels, error_code=error_code)

    def queue(
        self,
        job_type: str,
        limit: int,
        offset: int,
        owners: Sequence[str] = (),
        labels: Mapping[str, str] | None = None,
    ) -> QueuePage:
        """PENDING jobs in queue order, with their places and estimated starts (control.queue_view).

        Read from memory, where every PENDING job is; the records are live, so a caller converts
        them before it awaits anything."""
        pending = [j for j in self.active.values() if j.state is JobState.PENDING]
        return queue_page(pending, self.order, self.drain, self.clock.now(), job_type, owners, limit, offset, labels)

    async def purge(
        self,
        state: JobState,
        before: float,
        limit: int,
        after_seq: int = 0,
        *,
        dependency_failed_before: float | None = None,
    ) -> PurgeStep:
        """One step of a purge of the jobs in the terminal ``state`` past their retention (see
        :meth:`Store.purge_finished` and :mod:`control.retention`)."""
        async with self.rewrites:
            step = await self.store.purge_finished(
                state, before, limit, after_seq, dependency_failed_before=dependency_failed_before
            )
        for job_id in step.ids:
            self.recent.discard(job_id)
        if step.ids:
            self.counts[state] -= len(step.ids)
            self.metrics.jobs_purged.labels(state.name).inc(len(step.ids))
        return step

    # ---- shares ---------------------------------------------------------------------------------
    async def share_rows(self) -> tuple[list[ShareRow], Capacity]:
        """Every share of the cluster now, lowest fair-share rank first (control.shares), and the
        capacity their dominant shares are parts of. The queued jobs are counted by walking the live
        ones in turns: a million of them must not hold the loop."""
        queued: Counter[str] = Counter()
        async for _, part in in_turns(list(self.active.values()), SCAN_CHUNK):
            queued.update(job.owner for job in part if job.state is JobState.PENDING)
        capacity = self.registry.capacity()
        return self.usage.rows(self.shares, capacity, queued), capacity

    # ---- dispatch -------------------------------------------------------------------------------
    def workers_changed(self) -> None:
        """A worker left or started draining: readiness may have changed, and so may the most threads a
        job is granted, so a job set aside as too big for the others may fit one of them now."""
        self.on_change()
        self.dispatch_soon()

    def dispatch_soon(self) -> None:
        """Have a dispatch pass (control.dispatch) run this loop turn, once however often asked."""
        if not self._dispatch_pending:
            self._dispatch_pending = True
            asyncio.get_running_loop().call_soon(self._dispatch)

    def dispatch_now(self) -> None:
        """Run the dispatch pass now if one was asked for, so that its leases join the open transaction."""
        if self._dispatch_pending:
            self._dispatch()

    def _dispatch(self) -> None:
        self._dispatch_pending = False
        self.dispatcher.run()

    # ---- delayed jobs ---------------------------------------------------------------------------
    def wake_timer(self) -> None:
        """A job was pushed on the delayed queue from outside the timer: let it look again."""
        self._timer_wake.set()

    async def run_timer(self) -> None:
        """Promote SCHEDULED jobs when their time comes (scheduled_at or the end of a backoff)."""
        while True:
            due = self.delayed.next_due()
            now = self.clock.now()
            if due is not None and due <= now:
                self.promote_due(now)
                # A pause between chunks (control.turns): the commit, dispatch and calls go on while a
                # large batch falls due. 100,000 jobs due at one instant held every call for about a
                # second; in chunks of 500 the longest call took 64 ms.
                await pause()
                continue
            self._timer_wake.clear()
            timeout = None if due is None else max(0.0, due - now)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._timer_wake.wait(), timeout)

    def promote_due(self, now: float) -> None:
        """Make up to PROMOTE_CHUNK due SCHEDULED jobs PENDING (the timer comes back for the rest)."""
        promoted: list[JobRecord] = []
        for job_id in self.delayed.pop_due(now, PROMOTE_CHUNK):
            job = self.active.get(job_id)
            if job is None or job.state is not JobState.SCHEDULED:
                continue
            if job.ready_at > now:  # re-scheduled later since this entry was pushed
                self.delayed.push(job.id, job.ready_at)
                continue
            jobs.promote(job, now)
            self.moved(job, JobState.SCHEDULED)
            promoted.append(job)
        if promoted:
            self.later(promoted)

    # ---- stats ----------------------------------------------------------------------------------
    def state_counts(self) -> dict[JobState, int]:
        """How many jobs are in each state now, every state named (0 for none), purged jobs not counted."""
        return {s: self.counts.get(s, 0) for s in JobState}
