"""Jobs that start after others: ``depends_on``, the waits it makes, and what ends them.

A job submitted with ``depends_on`` waits SCHEDULED, with ``waiting_on`` the jobs it names that have
not SUCCEEDED yet, and is in no queue meanwhile. When one of those jobs reaches a terminal state
(:meth:`Dependencies.ended`, called by the scheduler on every transition to one):

* SUCCEEDED: it is no longer waited for; a job that waits for nothing more becomes PENDING, or stays
  SCHEDULED until its own ``scheduled_at``;
* FAILED or CANCELLED: the waiting job is CANCELLED with ``DEPENDENCY_FAILED``, and, being terminal
  in turn, takes what waits for it along.

RetryJob on a FAILED job brings back what its failure cancelled (:meth:`Dependencies.cancelled_chain`,
then :meth:`Dependencies.revive`): each job CANCELLED with ``DEPENDENCY_FAILED`` down the chain from it
waits SCHEDULED again, unless another job it depends on is still FAILED or CANCELLED (or no longer
stored), in which case it could never start and stays as it is.

At submission (:meth:`Dependencies.find`, then :meth:`Dependencies.waiting_for`) every job named
must exist and be visible to the caller, and none may already be FAILED or CANCELLED: such a job
could never start, so it is refused rather than stored. What a job still waits for is worked out
with no ``await`` between that and the job's creation, so a dependency cannot end unseen in
between. After a restart :meth:`Dependencies.recover` works the waits out again from the store: a
dependency that is no longer stored was purged after it finished, and since a failed or cancelled
one cancels its dependents in the same transaction, only a SUCCEEDED one can have left any behind.

A job submitted with ``start_when`` ALL_ENDED waits instead for each job it names to end, however it
ends: FAILED and CANCELLED count as SUCCEEDED do, for jobs that clean up or report after others. Such a
job is never cancelled by a dependency, a dependency that already FAILED is no reason to refuse it, and
RetryJob of a dependency does not run it again once it ran.

A job of a ``SubmitJobs`` batch may also name earlier jobs of the same batch by their place in it
(``depends_on_index``), so a whole graph goes in one call. :meth:`Dependencies.batch_links` works out
what each index stands for, with no ``await`` before the jobs' creation: a job this call creates, or
one an earlier request made that the batch reuses by its idempotency key (refused when FAILED or
CANCELLED, as a job named by id is). The job's ``depends_on`` then holds their ids after its own, so
from then on they are dependencies like any other.

Nothing here is stored apart from ``depends_on`` itself; the changes it makes go through the
scheduler (``moved``, ``later``) like any other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from control import jobs
from control.admission import Submission
from control.admission.idempotency import Earlier
from control.jobs import JobRecord, JobState, StartWhen
from control.turns import pause
from corral.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable

if TYPE_CHECKING:
    from control.scheduler import Scheduler

__all__ = ["BatchLinks", "CancelledChain", "Dependencies"]

_BROKEN = (JobState.FAILED, JobState.CANCELLED)
ENDED_CHUNK = 500
"""Jobs waiting for one that ended that move per loop turn (:meth:`Dependencies.ended`)."""


@dataclass(frozen=True)
class CancelledChain:
    """What a failed job's failure cancelled down the chain (:meth:`Dependencies.cancelled_chain`)."""

    jobs: dict[str, JobRecord]
    """The jobs CANCELLED with DEPENDENCY_FAILED, by id."""
    others: dict[str, JobRecord | None]
    """The finished jobs they depend on besides (None: no longer stored)."""


@dataclass(frozen=True)
class BatchLinks:
    """What a new job's ``depends_on_index`` stands for (:meth:`Dependencies.batch_links`)."""

    created: tuple[int, ...]
    """Places in the batch of jobs this call creates."""
    reused: tuple[str, ...]
    """Ids of jobs earlier requests made, which the batch reuses by their idempotency keys."""
    unfinished: frozenset[str]
    """Those of ``reused`` that have not SUCCEEDED yet."""

    def resolve(
        self, made: Sequence[JobRecord | str], depends_on: tuple[str, ...], waiting: frozenset[str]
    ) -> tuple[tuple[str, ...], frozenset[str]]:
        """The job's ``depends_on`` (its own ids, then these) and what it waits for, given ``made``: the
        batch's jobs so far, in order (each created one a record)."""
        created = [made[k] for k in self.created]
        ids = [job if isinstance(job, str) else job.id for job in created]
        every = tuple(dict.fromkeys((*depends_on, *ids, *self.reused)))
        return every, waiting | frozenset(ids) | self.unfinished


class Dependencies:
    """The waits of one scheduler: which jobs wait for which."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.s = scheduler
        self.waiters: dict[str, list[str]] = {}
        """Job id -> the SCHEDULED jobs that wait for it to SUCCEED."""
        self._moving: set[asyncio.Task[None]] = set()
        """The moves of waiting jobs left for later loop turns (:meth:`ended`)."""

    def wait(self, job: JobRecord) -> None:
        """``job`` (new or recovered, ``waiting_on`` set) waits for its dependencies."""
        for dep_id in job.waiting_on:
            self.waiters.setdefault(dep_id, []).append(job.id)

    def ended(self, dep_id: str, state: JobState) -> None:
        """``dep_id`` reached the terminal ``state``: the jobs waiting for it go on waiting for the rest,
        become ready, or are CANCELLED, and so on down the chain.

        :data:`ENDED_CHUNK` of them now, the rest a chunk per loop turn after: a job that 100,000 others
        wait for would otherwise hold the loop, and every call with it, while all of them moved. Those
        left for later still wait meanwhile; RetryJob waits until none is left (:meth:`settled`), and
        after a restart :meth:`recover` works out the same from the store."""
        waiting = self.waiters.pop(dep_id, None)
        if not waiting:
            return
        self._ended(dep_id, state, waiting[:ENDED_CHUNK])
        if len(waiting) > ENDED_CHUNK:
            task = asyncio.ensure_future(self._ended_in_turns(dep_id, state, waiting[ENDED_CHUNK:]))
            self.s.spawn(task)
            self._moving.add(task)
            task.add_done_callback(self._moving.discard)

    async def _ended_in_turns(self, dep_id: str, state: JobState, rest: list[str]) -> None:
        for start in range(0, len(rest), ENDED_CHUNK):
            await pause()
            self._ended(dep_id, state, rest[start : start + ENDED_CHUNK])

    async def settled(self) -> None:
        """Return once every job waiting for one that ended has moved (:meth:`ended`), those their own
        moves set off included: what a failure cancelled down the chain is then all in the store, for
        :meth:`cancelled_chain`."""
        while self._moving:
            await asyncio.wait(list(self._moving))

    def _ended(self, dep_id: str, state: JobState, waiting: Sequence[str]) -> None:
        """:meth:`ended` for the jobs ``waiting``."""
        s = self.s
        now = s.clock.now()
        changed: list[JobRecord] = []
        for job_id in waiting:
            job = s.active.get(job_id)
            if job is None or job.state is not JobState.SCHEDULED or dep_id not in job.waiting_on:
                continue  # cancelled meanwhile
            changed.append(job)
            if job.start_when.met_by(state):
                if jobs.dependency_met(job, dep_id):
                    self._met(job, now)
            else:
                message = f"job {dep_id!r}, which it depends on, ended {state.name}"
                s.moved(job, jobs.cancel(job, now, jobs.DEPENDENCY_FAILED, message))
        if changed:
            s.later(changed)

    def _met(self, job: JobRecord, now: float) -> None:
        """Every job ``job`` waited for did what it asked: ready now, or at its own ``scheduled_at``."""
        s = self.s
        if job.scheduled_at is not None and job.scheduled_at > now:
            job.ready_at = job.scheduled_at
            s.delayed.push(job.id, job.ready_at)
            s.wake_timer()
        else:
            jobs.promote(job, now)
            s.moved(job, JobState.SCHEDULED)

    async def cancelled_chain(self, failed_id: str) -> CancelledChain:
        """Read what the failure of ``failed_id`` cancelled down the chain, and the finished jobs those
        depend on besides, for :meth:`revive` (only reads: nothing changes)."""
        s = self.s
        chain = {job.id: job for job in await s.store.cancelled_chain(failed_id) if job.id not in s.active}
        others: dict[str, JobRecord | None] = {}
        for job in chain.values():
            for dep in job.depends_on:
                if dep != failed_id and dep not in chain and dep not in s.active and dep not in others:
                    others[dep] = s.recent.get(dep) or await s.store.get(dep)
        return CancelledChain(chain, others)

    def revive(self, retried: JobRecord, chain: CancelledChain, now: float) -> list[JobRecord]:
        """``retried`` is live again (RetryJob): the jobs of ``chain`` that could now start wait SCHEDULED
        again for what they depend on; returns them, moved (counts and waits included; the caller
        stores them). No ``await`` may come between ``retried`` going live and this: a retried job that
        ended meanwhile would leave its dependents waiting for ever."""
        s = self.s
        # Leave out, until none is left to leave out, each job that depends on one that stays broken
        # (FAILED, CANCELLED and not coming back, or no longer stored): it could never start.
        fine = {retried.id, *chain.jobs}
        changed = True
        while changed:
            changed = False
            for job_id, job in chain.jobs.items():
                if job_id in fine and not all(self._can_end_well(d, fine, chain.others) for d in job.depends_on):
                    fine.discard(job_id)
                    changed = True
        revived = [job for job_id, job in chain.jobs.items() if job_id in fine]
        live = s.active
        for job in revived:
            waiting = frozenset(d for d in job.depends_on if d in fine or (d in live and not live[d].state.terminal))
            jobs.revive(job, now, waiting)
            s.recent.discard(job.id)
            s.active[job.id] = job
            s.counts[JobState.CANCELLED] -= 1
            s.counts[JobState.SCHEDULED] += 1
            self.wait(job)
        return revived

    def _can_end_well(self, dep_id: str, fine: set[str], stored: dict[str, JobRecord | None]) -> bool:
        """Whether dependency ``dep_id`` has SUCCEEDED, or still may."""
        if dep_id in fine:
            return True
        known = self.s.active.get(dep_id) or self.s.recent.get(dep_id) or stored.get(dep_id)
        return known is not None and known.state not in _BROKEN

    async def find(
        self, subs: Sequence[Submission], batch: bool, caller: str, skip: Container[int] = ()
    ) -> dict[str, JobRecord]:
        """Check that every job ``subs`` depend on exists and that ``caller`` may see it; returns the
        records of those not live (read from the store), for :meth:`waiting_for`. ``skip``: the places
        of submissions not checked (idempotent replays: no new job).

        Raises:
            InvalidArgument: ``depends_on[i]`` names no job the caller can see.
        """
        s = self.s
        found: dict[str, JobRecord] = {}
        for n, sub in enumerate(subs):
            if n in skip:
                continue
            for i, dep_id in enumerate(sub.depends_on):
                dep = s.active.get(dep_id) or s.recent.get(dep_id) or found.get(dep_id)
                if dep is None:
                    dep = await s.store.get(dep_id)
                field = _field(batch, n, i)
                if dep is None:
                    raise InvalidArgument(field, f"no job {dep_id!r}")
                try:
                    s.access.check_visible(dep, caller)
                except NotFound:
                    raise InvalidArgument(field, f"no job {dep_id!r}") from None
                if dep_id not in s.active:
                    found[dep_id] = dep
        return found

    def waiting_for(
        self, subs: Sequence[Submission], batch: bool, found: dict[str, JobRecord], skip: Container[int] = ()
    ) -> dict[int, frozenset[str]]:
        """For each submission with dependencies (but those at the places ``skip`` holds), those not
        SUCCEEDED now. No await may come between this and the jobs' creation: a dependency that ended
        meanwhile would be missed.

        Raises:
            FailedPrecondition: a dependency is FAILED or CANCELLED: the job could never start.
            Unavailable: a dependency ended during the call and is known no more (rare; send again).
        """
        s = self.s
        waiting: dict[int, frozenset[str]] = {}
        for n, sub in enumerate(subs):
            if n in skip:
                continue
            left = set()
            rule = StartWhen(sub.start_when)
            for i, dep_id in enumerate(sub.depends_on):
                field = _field(batch, n, i)
                dep = s.active.get(dep_id) or s.recent.get(dep_id) or found.get(dep_id)
                if dep is None:  # it finished during this call and already left the recent ones
                    raise Unavailable(f"{field}: job {dep_id!r} finished while this call ran; send it again")
                if dep.state in _BROKEN and rule is StartWhen.ALL_SUCCEEDED:
                    raise FailedPrecondition(
                        f"{field}: job {dep_id!r} is {dep.state.name}; this job could never start "
                        "(with start_when ALL_ENDED it would start at once)"
                    )
                if not rule.met_by(dep.state):
                    left.add(dep_id)
            if left:
                waiting[n] = frozenset(left)
        return waiting

    async def read_ahead(
        self, subs: Sequence[Submission], earlier: Mapping[int, Earlier]
    ) -> dict[str, JobState | None]:
        """The stored states (None: not stored) of the jobs a batch's ``depends_on_index`` reuses by key
        (as ``earlier`` resolves the keys now) that memory no longer holds, read off the event loop for
        :meth:`batch_links`: a read on the loop stalled every call for as long as the store took.

        Raises:
            Unavailable: a shared store's server cannot be read.
        """
        s = self.s
        gone = [
            job_id for job_id in self._reused(subs, earlier) if job_id not in s.active and s.recent.get(job_id) is None
        ]
        if not gone:
            return {}
        found = await s.store.read_states(gone)
        return {job_id: found.get(job_id) for job_id in gone}

    def batch_links(
        self,
        subs: Sequence[Submission],
        earlier: Mapping[int, Earlier],
        ahead: Mapping[str, JobState | None] | None = None,
    ) -> dict[int, BatchLinks]:
        """For each submission of a batch that this call creates (not in ``earlier``, the idempotent
        replays) and that names earlier ones by ``depends_on_index``: what they stand for. Reads no more
        than memory and the store's states, with no ``await``, so that nothing can end unseen before
        the jobs exist. ``ahead``: what :meth:`read_ahead` read for the call, used for a job memory does
        not hold (such a job ended long ago, and only a retry, which brings it back to memory, changes
        it); what it does not cover (a key that resolved otherwise since) is read now.

        Raises:
            FailedPrecondition: an index stands for a job an earlier request made that is FAILED or
                CANCELLED (the job could never start), or that is no longer stored.
        """
        s = self.s
        reused = self._reused(subs, earlier)
        states = {job_id: s.active.get(job_id) or s.recent.get(job_id) for job_id in reused}
        stored: dict[str, JobState | None] = dict(ahead or {})
        unread = [job_id for job_id, job in states.items() if job is None and job_id not in stored]
        if unread:
            stored.update(s.store.states(unread))
        state_of = {job_id: job.state if job else stored.get(job_id) for job_id, job in states.items()}
        links: dict[int, BatchLinks] = {}
        for n, sub in enumerate(subs):
            if n in earlier or not sub.depends_on_index:
                continue
            rule = StartWhen(sub.start_when)
            targets = [_followed(earlier, k) for k in sub.depends_on_index]
            ids = tuple(t for t in targets if isinstance(t, str))
            for job_id in ids:
                state = state_of[job_id]
                # One no longer stored ended long ago: enough for ALL_ENDED, unknowable for ALL_SUCCEEDED.
                if rule is StartWhen.ALL_SUCCEEDED and (state is None or state in _BROKEN):
                    what = "no longer stored" if state is None else state.name
                    raise FailedPrecondition(
                        f"jobs[{reused[job_id]}]: its idempotency key names job {job_id!r}, which is {what}; "
                        f"jobs[{n}], which depends on it, could never start"
                    )
            links[n] = BatchLinks(
                created=tuple(t for t in targets if isinstance(t, int)),
                reused=ids,
                unfinished=frozenset(i for i in ids if (state := state_of[i]) is not None and not rule.met_by(state)),
            )
        return links

    @staticmethod
    def _reused(subs: Sequence[Submission], earlier: Mapping[int, Earlier]) -> dict[str, int]:
        """The ids of jobs an earlier request made that new jobs of a batch name by ``depends_on_index``,
        each with the first place that stands for it (for errors)."""
        reused: dict[str, int] = {}
        for n, sub in enumerate(subs):
            if n not in earlier:
                for k in sub.depends_on_index:
                    if isinstance(target := _followed(earlier, k), str):
                        reused.setdefault(target, k)
        return reused

    def recover(self, blocked: list[JobRecord]) -> None:
        """At start-up, once every live job is loaded: what each SCHEDULED job with dependencies still
        waits for (see the module docstring), or its cancellation, or its place in the delayed queue."""
        s = self.s
        stored = s.store.states({d for job in blocked for d in job.depends_on if d not in s.active})
        now = s.clock.now()
        cancelled: list[JobRecord] = []
        for job in blocked:
            # A live dependency may have been cancelled by this recovery already (its own dependency had
            # failed, and the crash came before the cancel reached it): its live state is what counts.
            state_of = {d: s.active[d].state if d in s.active else stored.get(d) for d in job.depends_on}
            left = {d for d, state in state_of.items() if d in s.active and state is not None and not state.terminal}
            broken = (
                [(d, state) for d, state in state_of.items() if state is not None and state in _BROKEN]
                if job.start_when is StartWhen.ALL_SUCCEEDED
                else []
            )
            if broken:
                message = f"job {broken[0][0]!r}, which it depends on, ended {broken[0][1].name}"
                s.moved(job, jobs.cancel(job, now, jobs.DEPENDENCY_FAILED, message))
                cancelled.append(job)
            elif left:
                job.waiting_on = frozenset(left)
                self.wait(job)
            else:
                s.delayed.push(job.id, job.ready_at)
        if cancelled:
            s.later(cancelled)


def _followed(earlier: Mapping[int, Earlier], k: int) -> Earlier:
    """What the batch's job ``k`` is: its own place when this call creates it, else the id of the job
    its idempotency key names (a key repeated in the batch is the batch's first job with it)."""
    target: Earlier = k
    while isinstance(target, int) and target in earlier:
        target = earlier[target]
    return target


def _field(batch: bool, n: int, i: int) -> str:
    """The name of dependency ``i`` of submission ``n``, as errors give it."""
    return f"jobs[{n}].depends_on[{i}]" if batch else f"depends_on[{i}]"
