"""Which worker gets the next job: the selection policies and the placement rules.

Placement is credit-based: a worker is offered a job only while it has a free slot and the threads
the job was granted, so no worker ever holds work it cannot start. A job asking for more threads
than any connected worker has is granted the most any worker has (and records that). GPUs and memory
are not scaled down: a job that asks for them goes only to a worker with that many GPUs and that much
memory not held by its other jobs.

Policies pick among the workers that can take the job:

- :class:`RoundRobin` (the default) walks the workers in registration order from just after the
  last one it chose, so equal workers take turns.
- :class:`LeastRecentlyUsed` picks the worker whose last assignment is oldest.
- :class:`LeastLoaded` picks the worker with the smallest part of its threads in use (least
  connections, weighed by size), so a mixed fleet fills evenly.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Protocol

from control.registry import Needs, WorkerEntry, registration_order


class SelectionPolicy(Protocol):
    """Chooses a worker for a job needing ``threads`` threads and ``needs`` (GPUs, MiB), or None when
    none can take it."""

    def choose(self, workers: Sequence[WorkerEntry], threads: int, needs: Needs = (0, 0)) -> WorkerEntry | None: ...


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
        best: WorkerEntry | None = None
        for w in workers:
            if w.can_take(threads, needs) and (best is None or w.last_assigned_at < best.last_assigned_at):
                best = w
        return best


class LeastLoaded:
    """The eligible worker with the smallest part of its threads in use; ties go to the earlier one."""

    def choose(self, workers: Sequence[WorkerEntry], threads: int, needs: Needs = (0, 0)) -> WorkerEntry | None:
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
