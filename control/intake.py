"""Intake: new jobs admitted, stored and queued, each call in one transaction.

A submission goes through admission (control.admission) in its declared order: the batch size and
each job's validation against its type's schema, then the dependencies it names
(control.dependencies), its idempotency key, and the submission rate limit. Nothing is stored for a
refused call. The accepted jobs are inserted, queued where they wait (PENDING, SCHEDULED, or waiting
for other jobs), and leased at once to free workers in the same transaction; the call returns them
once it is committed. A replayed idempotency key returns the job that key made, and creates none.
"""

from __future__ import annotations

import logging
import os
import sys
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from control import jobs
from control.admission import Submission, check_batch_size, validate, validate_part
from control.admission.idempotency import Ahead, unowned_form
from control.jobs import JobRecord, JobState, StartWhen
from control.store import IdempotencyEntry, JobRows
from control.turns import CHUNK, in_turns
from corral import logs
from corral.errors import NotFound, RateLimited, Unavailable

if TYPE_CHECKING:
    from control.scheduler import Scheduler

__all__ = ["Intake"]

logger = logging.getLogger(__name__)


class Intake:
    """New jobs into the scheduler; see the module docstring."""

    def __init__(self, scheduler: Scheduler, last_seq: int) -> None:
        self.s = scheduler
        self._seq = last_seq
        """The newest job's sequence number: the next job's is one more (the queue's last tie-break)."""

    async def submit(
        self, subs: list[Submission], batch: bool = False, client: str = "", owner: str = ""
    ) -> list[JobRecord]:
        """Admit, store and queue jobs; returns them once committed (idempotent replays included).

        ``client`` is the caller's identity, for the per-client submission rate limit; ``owner`` the
        principal the new jobs belong to (control.access), whose idempotency keys they use."""
        if batch:
            check_batch_size(subs, self.s.limits)
            async for start, part in in_turns(subs):  # no change made yet: other calls may run between
                validate_part(part, start, self.s.catalog, self.s.limits)
        else:
            for sub in subs:
                validate(sub, self.s.catalog, self.s.limits)
        key_of = self.s.access.idempotency_key
        keyed = {
            i: (key_of(sub.idempotency_key, owner), sub.request_hash())
            for i, sub in enumerate(subs)
            if sub.idempotency_key
        }
        # A client that may see jobs with no owner also finds their keys (admission.idempotency.unowned_form).
        unowned = bool(keyed) and bool(owner) and self.s.access.scope(owner) is None
        # What the store holds that memory may lack (keys let go of, the states of jobs a batch reuses by
        # key), read now, off the event loop: nothing below reads the store on it, and it settles with no
        # await from the keys' resolution to their reservation.
        wanted = [key for key, _ in keyed.values()]
        if unowned:
            wanted += [unowned_form(key) for key in wanted]
        ahead = await self.s.idempotency.read_ahead(wanted) if keyed else {}
        try:
            return await self._settle(subs, batch, client, owner, keyed, ahead, unowned)
        finally:
            self.s.idempotency.let_go(ahead)

    async def _settle(
        self,
        subs: list[Submission],
        batch: bool,
        client: str,
        owner: str,
        keyed: dict[int, tuple[str, str]],
        ahead: Ahead,
        unowned: bool,
    ) -> list[JobRecord]:
        """:meth:`submit` once the submissions are valid and ``ahead`` read: resolve, reserve, store."""
        key_field = "jobs[{}].idempotency_key" if batch else "idempotency_key"
        known: dict[str, JobState | None] = {}
        if batch and keyed and any(sub.depends_on_index for sub in subs):
            keys_now = self.s.idempotency.resolve(
                keyed, self.s.clock.now(), key_field, ahead, unowned
            )  # changes nothing
            known = await self.s.dependencies.read_ahead(subs, keys_now)
        depends = any(sub.depends_on for sub in subs)
        found: dict[str, JobRecord] = {}
        replays: set[int] = set()
        if depends:
            # A replay answers the job its key made, whatever has become since of the jobs it depends on
            # (one that FAILED would refuse the request as new): only new jobs' dependencies are checked.
            replays = (
                set(self.s.idempotency.resolve(keyed, self.s.clock.now(), key_field, ahead, unowned))
                if keyed
                else set()
            )
            found = await self.s.dependencies.find(subs, batch, owner, skip=replays)
            # A dependency's end still on its way to the store would decide this call (refused when it
            # failed) on what a crash could undo: wait for its commit. Only ends: a job that ended is
            # changed again only by a retry, so this waits a commit or two, however busy the others.
            # No await after this until the jobs are created.
            while any(self._ending(dep) for sub in subs for dep in sub.depends_on):
                await self.s.commit()
        now = self.s.clock.now()
        out: list[JobRecord | str] = []
        fresh: list[JobRecord] = []
        rows: JobRows | None = None
        keys: list[IdempotencyEntry] = []
        # Resolve every key before reserving any (a refused batch leaves nothing behind), and reserve
        # before the first await: a concurrent duplicate then finds this call's job (see admission).
        earlier = self.s.idempotency.resolve(keyed, now, key_field, ahead, unowned)
        waiting: dict[int, frozenset[str]] = {}
        if depends:
            if not replays <= earlier.keys():  # a key that expired during the read above: its job is new now
                raise Unavailable("an idempotency key expired while this call ran; send it again")
            waiting = self.s.dependencies.waiting_for(subs, batch, found, skip=earlier)  # no await until created
        links = {}
        if batch and any(sub.depends_on_index for sub in subs):
            links = self.s.dependencies.batch_links(subs, earlier, known)
        if self.s.submit_limits.enabled:
            # Charged for the jobs it would create, before anything is reserved or stored: a replay
            # creates nothing, so a client re-sending after a lost answer is never refused for it.
            try:
                self.s.submit_limits.admit(client, len(subs) - len(earlier), batch)
            except RateLimited:
                self.s.metrics.rate_limited.inc()
                raise
        if batch and len(subs) > CHUNK and not keyed and not links and not any(sub.depends_on for sub in subs):
            # Nothing in it must be settled without an await (keys, dependencies): made in turns.
            fresh, rows = await self._new_records(subs, now, owner)
            out += fresh
        else:
            for i, sub in enumerate(subs):
                if i in earlier:
                    self.s.metrics.idempotent_replays.inc()
                    prior = earlier[i]
                    out.append(prior if isinstance(prior, str) else out[prior])
                    continue
                depends_on, wait = sub.depends_on, waiting.get(i, frozenset())
                if i in links:
                    depends_on, wait = links[i].resolve(out, depends_on, wait)
                job = self._new_record(sub, now, owner, wait, depends_on)
                if i in keyed:
                    keys.append(self.s.idempotency.reserve(*keyed[i], job.id, now))
                fresh.append(job)
                out.append(job)
        if fresh:
            self._admit(fresh, rows)
            if keys:
                self.s.store.put_idempotency(keys)
        self.s.dispatch_now()  # lease what can start now in the submission's own transaction
        if keys:
            # By the commit itself: a caller gone meanwhile would leave its keys pending for their whole
            # TTL, and the cache of keys could no longer be trimmed past them.
            self.s.on_commit(lambda: self.s.idempotency.committed(k.key for k in keys))
        await self.s.commit()
        _log_submitted(fresh)
        return [
            o if isinstance(o, JobRecord) else await self._replayed(o, i, subs, keyed, client, owner)
            for i, o in enumerate(out)
        ]

    async def _replayed(
        self, job_id: str, i: int, subs: list[Submission], keyed: dict[int, tuple[str, str]], client: str, owner: str
    ) -> JobRecord:
        """The job ``job_id`` that submission ``i`` is a replay of. A key can outlive its job when the key
        TTL was lowered (keys made before keep the expiry they were given, and retention, at least the
        new TTL, may purge their jobs first): such a key is taken as expired, and the submission makes a
        job, once, as it would with no key left.

        Raises:
            NotFound: the job is gone and the submission was not keyed (a job it repeats in its own call),
                or names others of its batch by index (it cannot be made alone).
        """
        try:
            return await self.s.get(job_id)
        except NotFound:
            if i not in keyed or subs[i].depends_on_index or not self.s.idempotency.forget(keyed[i][0], job_id):
                raise
        logger.warning(logs.IDEMPOTENCY_KEY_OUTLIVED_JOB, extra={"job_id": job_id})
        (job,) = await self.submit([subs[i]], client=client, owner=owner)
        return job

    def _ending(self, job_id: str) -> bool:
        """Whether the job ``job_id`` has ended and its end is not committed yet."""
        job = self.s.active.get(job_id)
        return job is not None and job.state.terminal and job_id in self.s.unsettled

    def _admit(self, fresh: list[JobRecord], rows: JobRows | None = None) -> None:
        """Store new jobs (in the open transaction; ``rows``: their rows, made already) and put each
        where it waits."""
        self.s.store.insert(fresh, rows)
        self.s.unsettled.wrote(fresh)
        for job_type, n in Counter(job.type for job in fresh).items():  # one count per type, not per job
            self.s.metrics.job_submitted(job_type, n)
        for job in fresh:
            self.s.active[job.id] = job
            self.s.counts[job.state] += 1
            if job.state is JobState.PENDING:
                self.s.enqueue(job)
            elif job.waiting_on:
                self.s.dependencies.wait(job)
            else:
                self.s.delayed.push(job.id, job.ready_at)
                self.s.wake_timer()

    def admit_internal(self, subs: list[Submission], owner: str) -> list[JobRecord]:
        """Create jobs the control plane itself submits for ``owner`` (notifications), in the open
        transaction: no admission checks, rate limit or idempotency key; committed with what the
        caller persists next."""
        now = self.s.clock.now()
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
            rows += self.s.store.job_rows(made)
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
            timeout_sec=sub.timeout_sec or self.s.config.default_timeout_sec,
            max_attempts=sub.max_attempts or self.s.config.default_max_attempts,
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


def _log_submitted(fresh: Sequence[JobRecord]) -> None:
    if not logger.isEnabledFor(logging.INFO):  # a batch of thousands builds no line it would drop
        return
    for job in fresh:
        logger.info(logs.JOB_SUBMITTED, extra={"job_id": job.id, "type": job.type, "request_id": job.request_id})
