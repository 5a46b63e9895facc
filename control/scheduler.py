"""Scheduler: the control plane's core. It owns the live jobs, the queues and the worker registry.

All of its state lives on one asyncio event loop, so every check-then-change (a compare-and-set on
``(job id, attempt)``) is atomic. Changes are made in memory through ``control.jobs``, queued to the
store at once, and acknowledged or announced only after the store has committed them: a client, a
worker or a watcher never hears of a change that a crash could undo. Many changes share one commit.

Job-facing operations are here; the worker side (register, results, disconnects) is
``control.sessions``, lost workers / expired leases are ``control.reaper``, jobs that wait for
others are ``control.dependencies``, owners' shares of the workers are ``control.shares``, and the
streams that follow a job's changes and what it prints (WatchJob, RunJob, WatchOutput) are
``control.feeds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

from control import jobs
from control.access import Access, not_found, parse_groups
from control.admission import (
    IdempotencyKeys,
    JobTypeCatalog,
    Limits,
    Submission,
    check_batch_size,
    validate,
    validate_part,
)
from control.admission.idempotency import MAX_CACHED_KEYS
from control.admission.ratelimit import SubmitRateLimiter
from control.backoff import retry_delay
from control.clock import Clock
from control.config import ControlConfig
from control.dependencies import Dependencies
from control.dispatch import POLICIES, SelectionPolicy, granted_threads, reserve_for
from control.exec_limits import NO_GATES, ExecLimits, parse_exec_limits
from control.feeds import JobFeeds
from control.jobs import JobRecord, JobState, StartWhen
from control.live_output import LiveOutput
from control.metrics import Metrics
from control.notify.notices import Notices
from control.queue import DelayedQueue, LeaseQueue, QueueOrder, ReadyQueue
from control.queue_view import DrainRate, QueuePage, queue_page
from control.recent import RecentJobs
from control.registry import Assignment, Capacity, Needs, WorkerEntry, WorkerRegistry
from control.selection import JobSelection
from control.shares import OwnerQueues, OwnerUsage, ShareRow, ShareRules
from control.store import IdempotencyEntry, JobPage, JobRows, Store
from control.turns import CHUNK, in_turns, pause
from control.watch import Watchers
from corral import logs
from corral.errors import FailedPrecondition, RateLimited

logger = logging.getLogger(__name__)

MAX_SCAN = 64
"""Jobs the dispatcher may look past when the best ones fit no free worker (backfill depth)."""
LEASE_SLACK = 1024
"""Stale entries the lease queue may hold beyond twice the running jobs before it is rebuilt."""
PROMOTE_CHUNK = 500
"""Due SCHEDULED jobs made PENDING in one loop turn (one transaction); the rest follow turn by turn."""
JobKind = str | tuple[str, tuple[tuple[str, str], ...], Needs]
"""What decides which workers can run a job: its type, or (type, worker selector, (GPUs, MiB)) when it
has a selector or holds GPUs or memory."""
NO_NEEDS: Needs = (0, 0)
MAX_HOLD = 1024
"""Jobs one dispatch pass may set aside (behind execution rate limits, or for want of a worker that runs
their type) before it yields to the event loop."""
SCAN_CHUNK = 10_000
"""Live jobs looked at per loop turn by a walk over all of them (ListShares counts the queued ones):
about a millisecond each."""
CANCEL_CHUNK = 250
"""Jobs one CancelJobs transaction cancels; a loop turn goes between chunks (a call that waits behind a
cancel of 10,000 jobs needs several turns to be answered: `bench cancel_many`'s ``other_get_p99_ms``)."""


class Scheduler:
    """Live jobs, queues and workers; see the module docstring."""

    def __init__(self, store: Store, config: ControlConfig, clock: Clock, rng: random.Random | None = None) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        self.rng = rng or random.Random(config.backoff_seed)
        self.policy: SelectionPolicy = POLICIES[config.selection]()
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
        self.feeds = JobFeeds(self.watchers, self.live_output, self.get, self.get_many)
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
        self._seq = store.max_seq()
        self._dispatch_pending = False
        self._flush_pending = False
        self._after_commit: list[Callable[[], None]] = []
        self._timer_wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._rewrites = asyncio.Lock()
        # RetryJob reads a finished job, then writes it back live; a purge in between would delete the
        # row it then updates (the job would live in memory only). Both hold this lock.
        self._parked: dict[JobKind, list[tuple[float, float, int, str]]] = {}
        """PENDING jobs, by type (and worker selector), that no worker running them could take (see _park)."""
        self._unserved: set[JobKind] = set()
        """Kinds with parked jobs and no connected worker that runs them (logged once each)."""

    # ---- start-up: rebuild memory from the store --------------------------------------------------
    def recover(self) -> None:
        """Load live jobs; RUNNING ones stay leased to their (not yet reconnected) workers."""
        now = self.clock.now()
        blocked: list[JobRecord] = []
        for job in self.store.load_active():
            self.active[job.id] = job
            if job.state is JobState.PENDING:
                self._enqueue(job)
            elif job.state is JobState.SCHEDULED:
                if job.depends_on:
                    blocked.append(job)
                else:
                    self.delayed.push(job.id, job.ready_at)
            elif job.state is JobState.RUNNING:
                self.running.add(job.id)
                self.usage.started(job)
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
            self.store.update(changed)
        snapshot = list(changed)
        after = None if first else then

        def done() -> None:
            for job in snapshot:
                self.watchers.announce(job)
                if job.state.terminal:
                    self._retire(job)
            if after is not None:
                after()

        if first and then is not None:
            self._after_commit.insert(0, then)
        self._after_commit.append(done)
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._flush)

    async def _commit(self) -> None:
        """Commit what is queued now, then at once run the after-commit work that the commit covers:
        the announcements and assignments of this loop turn go out now, not a turn later."""
        covered, self._after_commit = self._after_commit, []  # all queued their writes before this commit
        if self.store.commit_now():
            for cb in covered:
                cb()
            return
        # The commit suspends (sync=full, PostgreSQL). It covers other calls' changes too, so a caller
        # cancelled meanwhile (a client's deadline, a closed stream) must not cut the work after it.
        task = asyncio.ensure_future(self._commit_covering(covered))
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
        if self._dispatch_pending:  # leases made this turn join the same transaction
            self._dispatch()
        self._flush_pending = False
        callbacks, self._after_commit = self._after_commit, []
        try:
            committed = self.store.commit_now()
        except Exception:
            logger.exception("commit_failed")
            return
        if not committed:
            self.spawn(self._commit_then(callbacks))
            return
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
        if after is JobState.PENDING:
            self._enqueue(job)
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
        if retry:
            logger.info(
                logs.JOB_RETRY_SCHEDULED,
                extra={
                    "job_id": job.id,
                    "attempt": attempt,
                    "reason": code,
                    "delay_sec": round(delay, 3),
                    "request_id": job.request_id,
                },
            )
        else:
            logger.info(
                logs.JOB_FAILED,
                extra={"job_id": job.id, "attempt": attempt, "reason": code, "request_id": job.request_id},
            )

    def _enqueue(self, job: JobRecord) -> None:
        self._queued[job.id] = self.ready.push(job.id, job.priority, job.ready_at, job.seq, job.owner)
        self.dispatch_soon()

    def _released(self, job_ids: list[str]) -> None:
        """An execution limit let these parked jobs go: back to the ready queue, in their old place."""
        for job_id in job_ids:
            job = self.active.get(job_id)
            if job is not None and job.state is JobState.PENDING:
                self._enqueue(job)

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

    # ---- submissions ----------------------------------------------------------------------------
    async def submit(
        self, subs: list[Submission], batch: bool = False, client: str = "", owner: str = ""
    ) -> list[JobRecord]:
        """Admit, store and queue jobs; returns them once committed (idempotent replays included).

        ``client`` is the caller's identity, for the per-client submission rate limit; ``owner`` the
        principal the new jobs belong to (control.access), whose idempotency keys they use."""
        if batch:
            check_batch_size(subs, self.limits)
            async for start, part in in_turns(subs):  # no change made yet: other calls may run between
                validate_part(part, start, self.catalog, self.limits)
        else:
            for sub in subs:
                validate(sub, self.catalog, self.limits)
        waiting: dict[int, frozenset[str]] = {}
        if any(sub.depends_on for sub in subs):
            found = await self.dependencies.find(subs, batch, owner)
            waiting = self.dependencies.waiting_for(subs, batch, found)  # no await from here until the jobs exist
        now = self.clock.now()
        out: list[JobRecord | str] = []
        fresh: list[JobRecord] = []
        rows: JobRows | None = None
        keys: list[IdempotencyEntry] = []
        # Resolve every key before reserving any (a refused batch leaves nothing behind), and reserve
        # before the first await: a concurrent duplicate then finds this call's job (see admission).
        key_of = self.access.idempotency_key
        keyed = {
            i: (key_of(sub.idempotency_key, owner), sub.request_hash())
            for i, sub in enumerate(subs)
            if sub.idempotency_key
        }
        earlier = self.idempotency.resolve(keyed, now, "jobs[{}].idempotency_key" if batch else "idempotency_key")
        links = {}
        if batch and any(sub.depends_on_index for sub in subs):
            links = self.dependencies.batch_links(subs, earlier)
        if self.submit_limits.enabled:
            # Charged for the jobs it would create, before anything is reserved or stored: a replay
            # creates nothing, so a client re-sending after a lost answer is never refused for it.
            try:
                self.submit_limits.admit(client, len(subs) - len(earlier), batch)
            except RateLimited:
                self.metrics.rate_limited.inc()
                raise
        if batch and len(subs) > CHUNK and not keyed and not links and not any(sub.depends_on for sub in subs):
            # Nothing in it must be settled without an await (keys, dependencies): made in turns.
            fresh, rows = await self._new_records(subs, now, owner)
            out += fresh
        else:
            for i, sub in enumerate(subs):
                if i in earlier:
                    self.metrics.idempotent_replays.inc()
                    prior = earlier[i]
                    out.append(prior if isinstance(prior, str) else out[prior])
                    continue
                depends_on, wait = sub.depends_on, waiting.get(i, frozenset())
                if i in links:
                    depends_on, wait = links[i].resolve(out, depends_on, wait)
                job = self._new_record(sub, now, owner, wait, depends_on)
                if i in keyed:
                    keys.append(self.idempotency.reserve(*keyed[i], job.id, now))
                fresh.append(job)
                out.append(job)
        if fresh:
            self._admit(fresh, rows)
            if keys:
                self.store.put_idempotency(keys)
        if self._dispatch_pending:  # lease what can start now in the submission's own transaction
            self._dispatch()
        await self._commit()
        if keys:
            self.idempotency.committed(k.key for k in keys)
        _log_submitted(fresh)
        return [o if isinstance(o, JobRecord) else await self.get(o) for o in out]

    def _admit(self, fresh: list[JobRecord], rows: JobRows | None = None) -> None:
        """Store new jobs (in the open transaction; ``rows``: their rows, made already) and put each
        where it waits."""
        self.store.insert(fresh, rows)
        for job_type, n in Counter(job.type for job in fresh).items():  # one count per type, not per job
            self.metrics.job_submitted(job_type, n)
        for job in fresh:
            self.active[job.id] = job
            self.counts[job.state] += 1
            if job.state is JobState.PENDING:
                self._enqueue(job)
            elif job.waiting_on:
                self.dependencies.wait(job)
            else:
                self.delayed.push(job.id, job.ready_at)
                self._timer_wake.set()

    def admit_internal(self, subs: list[Submission], owner: str) -> list[JobRecord]:
        """Create jobs the control plane itself submits for ``owner`` (notifications), in the open
        transaction: no admission checks, rate limit or idempotency key; committed with what the
        caller persists next."""
        now = self.clock.now()
        fresh = [self._new_record(sub, now, owner, frozenset(), ()) for sub in subs]
        self._admit(fresh)
        _log_submitted(fresh)
        return fresh

    async def _new_records(self, subs: list[Submission], now: float, owner: str) -> tuple[list[JobRecord], JobRows]:
        """The records of a large batch that has nothing to settle in one go (no idempotency key, no
        dependency), and their store rows, made a chunk per loop turn: 10,000 of them held the loop
        about 33 ms in one piece, and their rows about 15 ms more. Their seqs are taken before the first
        turn, so that the batch keeps its order in the queue and in listings whatever is submitted
        meanwhile. Nothing is stored or queued until all are made, and nothing else sees the records
        until then, so the rows stay true to them."""
        first = self._seq + 1
        self._seq += len(subs)
        records: list[JobRecord] = []
        rows: JobRows = []
        async for start, part in in_turns(subs):
            made = [
                self._new_record(sub, now, owner, frozenset(), (), seq=first + i) for i, sub in enumerate(part, start)
            ]
            records += made
            rows += self.store.job_rows(made)
        return records, rows

    def _new_record(
        self,
        sub: Submission,
        now: float,
        owner: str,
        waiting: frozenset[str],
        depends_on: tuple[str, ...],
        seq: int | None = None,
    ) -> JobRecord:
        """A new job's record; ``seq`` when taken beforehand (else the next one)."""
        if seq is None:
            self._seq += 1
            seq = self._seq
        job = JobRecord(
            id=os.urandom(16).hex(),
            seq=seq,
            type=sys.intern(sub.type),  # one string per type, not one per queued job
            payload_json=sub.payload_json,
            created_at=now,
            name=sub.name,
            priority=sub.priority,
            thread_demand=sub.thread_demand or 1,
            timeout_sec=sub.timeout_sec or self.config.default_timeout_sec,
            max_attempts=sub.max_attempts or self.config.default_max_attempts,
            scheduled_at=sub.scheduled_at,
            idempotency_key=sub.idempotency_key,
            labels=sub.labels,
            request_id=logs.current_request.get(),
            owner=sys.intern(owner),
            worker_selector=tuple(sorted(sub.worker_selector.items())) if sub.worker_selector else (),
            depends_on=depends_on,
            gpu_count=sub.gpu_count,
            memory_mb=sub.memory_mb,
            notify=sub.notify,
            start_when=StartWhen.ALL_ENDED if sub.start_when else StartWhen.ALL_SUCCEEDED,  # checked: 0 or 1
        )
        job.waiting_on = waiting
        jobs.new_job(job, now)
        return job

    # ---- reads ----------------------------------------------------------------------------------
    async def get(self, job_id: str) -> JobRecord:
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

        Raises:
            NotFound: the first id that names no job.
        """
        found: dict[str, JobRecord] = {}
        missing: list[str] = []
        for job_id in job_ids:
            job = self.active.get(job_id) or self.recent.get(job_id)
            if job is None:
                missing.append(job_id)
            else:
                found[job_id] = job
        if missing:
            found.update((job.id, job) for job in await self.store.get_many(missing))
        for job_id in job_ids:
            if job_id not in found:
                raise not_found(job_id)
        return [found[job_id] for job_id in job_ids]

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

    # ---- cancel / retry -------------------------------------------------------------------------
    async def cancel(self, job_id: str) -> JobRecord:
        job = self.active.get(job_id)
        if job is None:
            found = await self.get(job_id)
            raise FailedPrecondition(f"job {job_id!r} is {found.state.name}; only unfinished jobs can be cancelled")
        await self._cancel_now([job])
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
            candidates: Iterable[JobRecord] = self.active.values()
        else:
            named = await self._named(job_ids, check)
            candidates = (self.active[job.id] for job in named if job.id in self.active)
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
                return await self.list_jobs(
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
        named = await self.get_many(job_ids)
        if check is not None:
            for job in named:
                check(job)
        return named

    def _unfinished(self, job: JobRecord) -> bool:
        return self.active.get(job.id) is job and not job.state.terminal

    async def _cancel_now(self, chosen: list[JobRecord]) -> None:
        """Cancel ``chosen`` (live, unfinished) in one transaction; once it is committed, stop their
        running attempts and tell their watchers."""
        now = self.clock.now()
        was: list[tuple[JobRecord, JobState, int, str]] = []
        for job in chosen:
            attempt, worker_id = job.attempts, job.worker_id
            before = jobs.cancel(job, now)
            self.moved(job, before)
            if before is JobState.PENDING and self.exec_limits is not None:
                self.exec_limits.discard(job.id)  # it may be parked by an execution limit
            was.append((job, before, attempt, worker_id))
        self.store.update(chosen)
        await self._commit()
        for job, before, attempt, worker_id in was:
            logger.info(logs.JOB_CANCELLED, extra={"job_id": job.id, "was": before.name})
            if before is JobState.RUNNING:
                worker = self.registry.get(worker_id)
                if worker is not None and worker.link is not None:
                    worker.link.cancel(job.id, attempt)
            self.watchers.announce(job)
            self._retire(job)

    async def retry(self, job_id: str) -> JobRecord:
        if job_id in self.active:
            job = self.active[job_id]
            raise FailedPrecondition(f"job {job_id!r} is {job.state.name}; only FAILED jobs can be retried")
        async with self._rewrites:
            # What its failure cancelled down the chain, all of it, stored and no longer live: the chain
            # is read from the store, and only jobs not live are brought back.
            await self.dependencies.settled()
            await self._commit()
            job = await self.get(job_id)
            if job_id in self.active:  # raced with another retry while reading
                raise FailedPrecondition(
                    f"job {job_id!r} is {self.active[job_id].state.name}; only FAILED jobs can be retried"
                )
            if job.state is not JobState.FAILED:
                raise FailedPrecondition(f"job {job_id!r} is {job.state.name}; only FAILED jobs can be retried")
            chain = await self.dependencies.cancelled_chain(job_id)
            self.recent.discard(job_id)  # live again: reads must see the record as it changes
            now = self.clock.now()
            jobs.redrive(job, now)
            self.active[job.id] = job
            self.counts[JobState.FAILED] -= 1
            self.counts[job.state] += 1
            self._enqueue(job)
            revived = self.dependencies.revive(job, chain, now)
            self.store.update([job, *revived])
            await self._commit()
        self.metrics.job_redriven(job.type)
        logger.info(
            logs.JOB_RETRIED, extra={"job_id": job.id, "attempts": job.attempts, "revived": [r.id for r in revived]}
        )
        for changed in (job, *revived):
            self.watchers.announce(changed)
        return job

    async def purge(self, state: JobState, before: float, limit: int) -> int:
        """Delete up to ``limit`` jobs in the terminal ``state`` that finished by ``before`` (see
        :mod:`control.retention`); returns how many."""
        async with self._rewrites:
            ids = await self.store.purge_finished(state, before, limit)
        for job_id in ids:
            self.recent.discard(job_id)
        if ids:
            self.counts[state] -= len(ids)
            self.metrics.jobs_purged.labels(state.name).inc(len(ids))
        return len(ids)

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
    def dispatch_soon(self) -> None:
        if not self._dispatch_pending:
            self._dispatch_pending = True
            asyncio.get_running_loop().call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._dispatch_pending = False
        if not self.ready and not self._parked:
            return
        workers = self.registry.open()
        free = sum(w.free_slots for w in workers)
        if free <= 0:
            return
        if self._parked:
            self._unpark(workers)
        now = self.clock.now()
        grace = self.config.lease_grace_sec
        deferred: list[JobRecord] = []
        reserved: set[str] = set()
        batches: dict[str, list[Assignment]] = {}
        leased: list[JobRecord] = []
        candidates: list[WorkerEntry] = workers
        # Per job type, this pass: the candidates that run it, and the most threads a connected one has.
        typed: dict[JobKind, tuple[list[WorkerEntry], int]] = {}
        limits = self.exec_limits
        gates = NO_GATES
        held = 0
        while free > 0 and len(deferred) < MAX_SCAN:
            job_id = self.ready.pop()
            if job_id is None:
                break
            job = self.active[job_id]
            if limits is not None:
                gates = limits.gates_for(job.type, job.labels)
                if gates:
                    order = self.order.rank(job.priority, job.ready_at, job.seq)
                    gate = limits.blocker(gates, order, now)
                    if gate is not None:  # parked until its gate's next token: skip to the jobs behind
                        limits.hold(gate, order, job.id, now)
                        held += 1
                        if held >= MAX_HOLD:  # a long run of limited jobs: let the loop breathe
                            self.dispatch_soon()
                            break
                        continue
            kind = kind_of(job)
            needs = NO_NEEDS if isinstance(kind, str) else needs_of(job)
            view = typed.get(kind)
            if view is None:
                runs = [w for w in candidates if serves(w, kind)]
                view = typed[kind] = (runs, self._most_threads(kind))
            runners, most_threads = view
            threads = granted_threads(job.thread_demand, most_threads)
            worker = self.policy.choose(runners, threads, needs)
            if worker is None:
                # None of them has a free slot (or the GPUs and memory it holds) now: out of the way of
                # the jobs behind it, so that a queue of GPU jobs waiting for one GPU holds up nothing.
                if not any(w.room_for(needs) for w in runners):
                    self._park(job, bool(most_threads))
                    held += 1
                    if held >= MAX_HOLD:  # a long run of such jobs: let the loop breathe
                        self.dispatch_soon()
                        break
                    continue
                deferred.append(job)
                hold = reserve_for(runners, threads, needs)
                if hold is not None:
                    reserved.add(hold.id)
                    free -= hold.free_slots if hold.accepts_work else 0
                    candidates = [w for w in workers if w.id not in reserved]
                    typed.clear()
                continue
            if gates and limits is not None:
                limits.take(gates, job.id, now)
            attempt = jobs.lease(job, worker.id, threads, now, grace)
            self.metrics.dispatch_latency.observe(job.queue_seconds)
            self.moved(job, JobState.PENDING)
            self.registry.hold(worker, (job.id, attempt), threads, needs)
            worker.last_assigned_at = now
            free -= 1
            batches.setdefault(worker.id, []).append(
                Assignment(job.id, attempt, job.type, job.payload_json, threads, job.timeout_sec, job.gpu_count)
            )
            leased.append(job)
        for job in deferred:
            self._enqueue(job)
        if leased:
            self.drain.started(now, len(leased))

            def send() -> None:
                for wid, batch in batches.items():
                    w = self.registry.get(wid)
                    if w is not None and w.link is not None:
                        w.link.assign(batch)

            if logger.isEnabledFor(logging.INFO):
                for job in leased:
                    logger.info(
                        logs.JOB_DISPATCHED,
                        extra={
                            "job_id": job.id,
                            "attempt": job.attempts,
                            "worker_id": job.worker_id,
                            "request_id": job.request_id,
                        },
                    )
            self.later(leased, send, first=True)

    def _most_threads(self, kind: JobKind) -> int:
        if isinstance(kind, str):
            return self.registry.most_threads(kind)
        return self.registry.most_threads(*kind)

    def _park(self, job: JobRecord, served: bool) -> None:
        """Set aside a PENDING job that no worker running its type (matching its worker selector, with
        the GPUs and memory it asks for) can take now; ``served``: some connected such worker exists (it
        is busy or draining), else none."""
        kind = kind_of(job)
        rank = self.order.rank(job.priority, job.ready_at, job.seq)
        heapq.heappush(self._parked.setdefault(kind, []), (*rank, job.id))
        if not served and kind not in self._unserved:
            self._unserved.add(kind)
            wants: dict[str, object] = {}
            if job.worker_selector:
                wants["worker_selector"] = dict(job.worker_selector)
            if job.gpu_count:
                wants["gpu_count"] = job.gpu_count
            if job.memory_mb:
                wants["memory_mb"] = job.memory_mb
            logger.warning(logs.JOB_TYPE_UNSERVED, extra={"type": job.type, **wants})

    def _unpark(self, workers: list[WorkerEntry]) -> None:
        """Back to the ready queue, best first: as many parked jobs of each kind as the workers that run
        it have room for (free slots, and the GPUs and memory its jobs hold); the pass then places them in
        their order among the rest."""
        for kind, heap in list(self._parked.items()):
            needs = NO_NEEDS if isinstance(kind, str) else kind[2]
            room = sum(w.room_for(needs) for w in workers if serves(w, kind))
            if room > 0:
                self._unserved.discard(kind)
            while room > 0 and heap:
                job = self.active.get(heapq.heappop(heap)[3])
                if job is not None and job.state is JobState.PENDING and job.id not in self._queued:
                    self._queued[job.id] = self.ready.push(job.id, job.priority, job.ready_at, job.seq, job.owner)
                    room -= 1
            if not heap:
                del self._parked[kind]

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
        return {s: self.counts.get(s, 0) for s in JobState}


def _by_seq(job: JobRecord) -> int:
    return job.seq


def _log_submitted(fresh: Sequence[JobRecord]) -> None:
    if not logger.isEnabledFor(logging.INFO):  # a batch of thousands builds no line it would drop
        return
    for job in fresh:
        logger.info(logs.JOB_SUBMITTED, extra={"job_id": job.id, "type": job.type, "request_id": job.request_id})


def needs_of(job: JobRecord) -> Needs:
    """The GPUs and memory (MiB) ``job`` holds while it runs."""
    return (job.gpu_count, job.memory_mb)


def kind_of(job: JobRecord) -> JobKind:
    """Its type alone (the common case, and the cheapest key) unless it has a worker selector or holds
    GPUs or memory."""
    if not job.worker_selector and not job.gpu_count and not job.memory_mb:
        return job.type
    return (job.type, job.worker_selector, (job.gpu_count, job.memory_mb))


def serves(worker: WorkerEntry, kind: JobKind) -> bool:
    """Whether ``worker`` could ever run jobs of ``kind`` (its type, labels, GPUs and memory in all)."""
    if isinstance(kind, str):
        return worker.runs(kind)
    job_type, selector, (gpus, memory_mb) = kind
    return worker.runs(job_type) and (not selector or worker.matches(selector)) and worker.has(gpus, memory_mb)
