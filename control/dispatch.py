"""Which worker gets the next job: the selection policies and the placement rules.

Placement is credit-based: a worker is offered a job only while it has a free slot and the threads
the job was granted, so no worker ever holds work it cannot start. A job asking for more threads
than any connected worker has is granted the most any worker has (and records that). GPUs and memory
are not scaled down: a job that asks for them goes only to a worker with that many GPUs and that much
memory not held by its other jobs.

A dispatch pass (:class:`Dispatcher`) takes ready jobs best first and leases each to the worker its
policy picks, all in one transaction; the assignments go out once it is committed. A job that no
worker running its type could take now (its worker selector, GPUs and memory included) is parked
beside the queue, out of the way of the jobs behind it, until such a worker has room; a job that
would fit a busy worker reserves the one it should wait for, so that smaller jobs do not starve it.

Policies pick among the workers that can take the job:

- :class:`RoundRobin` (the default) walks the workers in registration order from just after the
  last one it chose, so equal workers take turns.
- :class:`LeastRecentlyUsed` picks the worker whose last assignment is oldest.
- :class:`LeastLoaded` picks the worker with the smallest part of its threads in use (least
  connections, weighed by size), so a mixed fleet fills evenly.
"""

from __future__ import annotations

import bisect
import heapq
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from control import jobs
from control.exec_limits import NO_GATES
from control.jobs import JobRecord, JobState
from control.registry import Assignment, AttemptKey, Needs, WorkerEntry, registration_order
from corral import logs

if TYPE_CHECKING:
    from control.scheduler import Scheduler

logger = logging.getLogger(__name__)

MAX_SCAN = 64
"""Jobs the dispatcher may look past when the best ones fit no free worker (backfill depth)."""
MAX_HOLD = 1024
"""Jobs one dispatch pass may set aside (behind execution rate limits, or for want of a worker that runs
their type) before it yields to the event loop."""
JobKind = str | tuple[str, tuple[tuple[str, str], ...], Needs]
"""What decides which workers can run a job: its type, or (type, worker selector, (GPUs, MiB)) when it
has a selector or holds GPUs or memory."""
NO_NEEDS: Needs = (0, 0)


class SelectionPolicy(Protocol):
    """Chooses a worker for a job needing ``threads`` threads and ``needs`` (GPUs, MiB), or None when
    none can take it."""

    def choose(self, workers: Sequence[WorkerEntry], threads: int, needs: Needs = (0, 0)) -> WorkerEntry | None:
        """One of ``workers`` that can take the job now (a free slot, ``threads`` free threads, and the
        GPUs and memory of ``needs`` free), or None."""
        ...


class RoundRobin:
    """Take turns in registration order, skipping workers that cannot take the job."""

    def __init__(self) -> None:
        self._last: int | None = None
        """Registration order of the worker chosen last: the next turn starts after it, whether or
        not that worker is among those offered now."""

    def choose(self, workers: Sequence[WorkerEntry], threads: int, needs: Needs = (0, 0)) -> WorkerEntry | None:
        """``workers`` in registration order (as the registry lists them)."""
        n = len(workers)
        if n == 0:
            return None
        start = 0 if self._last is None else bisect.bisect_right(workers, self._last, key=registration_order) % n
        for k in range(n):
            w = workers[(start + k) % n]
            if w.can_take(threads, needs):
                self._last = w.order
                return w
        return None


class LeastRecentlyUsed:
    """The eligible worker whose last assignment is oldest."""

    def choose(self, workers: Sequence[WorkerEntry], threads: int, needs: Needs = (0, 0)) -> WorkerEntry | None:
        """The worker that can take the job and was assigned one longest ago (never: first)."""
        best: WorkerEntry | None = None
        for w in workers:
            if w.can_take(threads, needs) and (best is None or w.last_assigned_at < best.last_assigned_at):
                best = w
        return best


class LeastLoaded:
    """The eligible worker with the smallest part of its threads in use; ties go to the earlier one."""

    def choose(self, workers: Sequence[WorkerEntry], threads: int, needs: Needs = (0, 0)) -> WorkerEntry | None:
        """The worker that can take the job with the smallest part of its threads in use."""
        best: WorkerEntry | None = None
        best_load = 0.0
        for w in workers:
            if not w.can_take(threads, needs):
                continue
            load = (w.threads - w.free_threads) / w.threads if w.threads else 0.0
            if best is None or load < best_load:
                best, best_load = w, load
        return best


POLICIES: dict[str, type[RoundRobin] | type[LeastRecentlyUsed] | type[LeastLoaded]] = {
    "round_robin": RoundRobin,
    "lru": LeastRecentlyUsed,
    "least_loaded": LeastLoaded,
}
"""Policy name (CORRAL_SELECTION) -> class."""


def granted_threads(demand: int, max_threads: int) -> int:
    """Threads a job gets: what it asked for, capped at the most any connected worker has."""
    return max(1, min(demand, max_threads)) if max_threads > 0 else demand


def reserve_for(workers: Sequence[WorkerEntry], threads: int, needs: Needs = (0, 0)) -> WorkerEntry | None:
    """The worker a job that fits nowhere right now should wait for: connected, not draining, with
    enough threads in total, and the most free threads already. Reserving it stops smaller jobs from
    starving the big one.

    A job that holds GPUs or memory reserves only a worker where those are free now: while it waits for
    a GPU, the worker's threads stay open to other jobs (it reserves them once the GPU is free)."""
    gpus, memory_mb = needs
    best: WorkerEntry | None = None
    for w in workers:
        if (
            w.connected
            and not w.draining
            and w.threads >= threads
            and (not gpus or w.free_gpus >= gpus)
            and (not memory_mb or w.free_memory_mb >= memory_mb)
            and (best is None or w.free_threads > best.free_threads)
        ):
            best = w
    return best


class Dispatcher:
    """The dispatch pass and the jobs it parks; see the module docstring. The scheduler runs a pass
    (:meth:`run`) once per loop turn in which jobs became ready or workers freed slots."""

    def __init__(self, scheduler: Scheduler, policy: SelectionPolicy) -> None:
        self.s = scheduler
        self.policy = policy
        """Which of the workers that can take a job gets it (CORRAL_SELECTION)."""
        self._parked: dict[JobKind, list[tuple[float, float, int, str]]] = {}
        """PENDING jobs, by kind, that no worker running them could take (see :meth:`_park`)."""
        self._unserved: set[JobKind] = set()
        """Kinds with parked jobs and no connected worker that runs them (logged once each)."""
        self.unsent: set[AttemptKey] = set()
        """Attempts leased whose assignment waits for the lease's commit: not sent on any stream yet."""

    def run(self) -> None:
        """Lease ready jobs, best first, to workers with free slots, in the open transaction; their
        assignments go out once it is committed, ahead of the rest that waited for it."""
        s = self.s
        if not s.ready and not self._parked:
            return
        workers = s.registry.open()
        free = sum(w.free_slots for w in workers)
        if free <= 0:
            return
        if self._parked:
            self._unpark(workers)
        now = s.clock.now()
        grace = s.config.lease_grace_sec
        active = s.active
        ready = s.ready
        deferred: list[JobRecord] = []
        reserved: set[str] = set()
        batches: dict[str, list[Assignment]] = {}
        leased: list[JobRecord] = []
        candidates: list[WorkerEntry] = workers
        # Per job type, this pass: the candidates that run it, and the most threads a connected one has.
        typed: dict[JobKind, tuple[list[WorkerEntry], int]] = {}
        limits = s.exec_limits
        gates = NO_GATES
        held = 0
        while free > 0 and len(deferred) < MAX_SCAN:
            job_id = ready.pop()
            if job_id is None:
                break
            job = active[job_id]
            if limits is not None:
                gates = limits.gates_for(job.type, job.labels)
                if gates:
                    order = s.order.rank(job.priority, job.ready_at, job.seq)
                    gate = limits.blocker(gates, order, now)
                    if gate is not None:  # parked until its gate's next token: skip to the jobs behind
                        limits.hold(gate, order, job.id, now)
                        held += 1
                        if held >= MAX_HOLD:  # a long run of limited jobs: let the loop breathe
                            s.dispatch_soon()
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
                        s.dispatch_soon()
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
            s.metrics.dispatch_latency.observe(job.queue_seconds)
            s.moved(job, JobState.PENDING)
            s.registry.hold(worker, (job.id, attempt), threads, needs)
            self.unsent.add((job.id, attempt))
            worker.last_assigned_at = now
            free -= 1
            batches.setdefault(worker.id, []).append(
                Assignment(job.id, attempt, job.type, job.payload_json, threads, job.timeout_sec, job.gpu_count)
            )
            leased.append(job)
        for job in deferred:
            # Back in their places, asking for no other pass: what lets them start (a result, a worker that
            # comes or frees threads) asks for one. Asking here ran a pass every loop turn while they waited.
            s.requeue(job)
        if leased:
            s.drain.started(now, len(leased))
            registry, unsent = s.registry, self.unsent

            logged = (
                [
                    {
                        "job_id": job.id,
                        "attempt": job.attempts,
                        "worker_id": job.worker_id,
                        "request_id": job.request_id,
                    }
                    for job in leased
                ]
                if logger.isEnabledFor(logging.INFO)
                else []
            )

            def send() -> None:
                for extra in logged:  # once committed: a lease a failed commit undid was never made
                    logger.info(logs.JOB_DISPATCHED, extra=extra)
                for wid, batch in batches.items():
                    unsent.difference_update((a.job_id, a.attempt) for a in batch)
                    w = registry.get(wid)
                    if w is not None and w.link is not None:
                        # Only what the worker still holds: an attempt charged as lost meanwhile (the
                        # worker came back on a new stream without it, or was reaped) must not run too.
                        held = [a for a in batch if (a.job_id, a.attempt) in w.running]
                        if held:
                            w.link.assign(held)

            s.later(leased, send, first=True)

    def _most_threads(self, kind: JobKind) -> int:
        if isinstance(kind, str):
            return self.s.registry.most_threads(kind)
        return self.s.registry.most_threads(*kind)

    def _park(self, job: JobRecord, served: bool) -> None:
        """Set aside a PENDING job that no worker running its type (matching its worker selector, with
        the GPUs and memory it asks for) can take now; ``served``: some connected such worker exists (it
        is busy or draining), else none."""
        kind = kind_of(job)
        rank = self.s.order.rank(job.priority, job.ready_at, job.seq)
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
        active = self.s.active
        for kind, heap in list(self._parked.items()):
            # Jobs that left while parked (cancelled) go now, whether or not their kind has room: a kind no
            # worker serves would keep them, and its entry in every pass, for as long as the process runs.
            while heap and not _still_pending(active.get(heap[0][3])):
                heapq.heappop(heap)
            needs = NO_NEEDS if isinstance(kind, str) else kind[2]
            room = sum(w.room_for(needs) for w in workers if serves(w, kind)) if heap else 0
            if room > 0:
                self._unserved.discard(kind)
            while room > 0 and heap:
                job = active.get(heapq.heappop(heap)[3])
                if _still_pending(job) and self.s.requeue(job):  # type: ignore[arg-type]
                    room -= 1
            if not heap:
                del self._parked[kind]
                self._unserved.discard(kind)


def _still_pending(job: JobRecord | None) -> bool:
    """Whether a parked entry's job still waits (it may have been cancelled, or be queued again already)."""
    return job is not None and job.state is JobState.PENDING


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
