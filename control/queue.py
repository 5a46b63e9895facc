"""The in-memory queues: ready jobs by priority then age (:class:`QueueOrder`), delayed jobs by due time,
and running leases by the time they end.

All are rebuilt from the store at start-up. Entries are removed lazily: a cancelled or already
leased job stays in the heap until it reaches the top, where the owner's ``is_live`` check drops it.
That keeps cancel O(1) and every push/pop O(log n).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

Rank = tuple[float, float, int]
"""Where a ready job stands in the queue: smaller first (see :meth:`QueueOrder.rank`)."""


@dataclass(frozen=True, slots=True)
class QueueOrder:
    """The order of ready jobs: priority (higher first), then the time each became ready, then submission.

    With ``aging_sec`` > 0 (CORRAL_PRIORITY_AGING_SEC), each ``aging_sec`` a job has waited since it
    became ready counts as one more priority level, so that no job waits for ever behind a steady stream
    of higher-priority ones: a priority-0 job that has waited 10 x ``aging_sec`` goes before a priority-9
    job that has just come. Two waiting jobs age alike, so the order between them never changes while they
    wait: it is a fixed key, and the queues stay heaps.
    """

    aging_sec: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.aging_sec) and self.aging_sec >= 0):
            raise ValueError(f"aging_sec must be >= 0, got {self.aging_sec!r}")

    def rank(self, priority: int, ready_at: float, seq: int) -> Rank:
        """The job's rank: (priority less the levels its wait is worth, so far or to come; ready time;
        submission sequence)."""
        if self.aging_sec:
            return (ready_at / self.aging_sec - priority, ready_at, seq)
        return (-priority, ready_at, seq)

    def ranks(self, jobs: Iterable[Ranked]) -> list[Rank]:
        """:meth:`rank` of each job, in one pass without a call per job (the queue view ranks every
        PENDING job at once)."""
        if self.aging_sec:
            per_level = self.aging_sec
            return [(j.ready_at / per_level - j.priority, j.ready_at, j.seq) for j in jobs]
        return [(-j.priority, j.ready_at, j.seq) for j in jobs]


class Ranked(Protocol):
    """What :meth:`QueueOrder.ranks` reads of a job."""

    @property
    def priority(self) -> int:
        """Its priority: higher goes first."""
        ...

    @property
    def ready_at(self) -> float:
        """When it became ready (Unix seconds)."""
        ...

    @property
    def seq(self) -> int:
        """Its submission sequence: between equals, the one submitted first goes first."""
        ...


STRICT = QueueOrder()
"""Priority, then age, with no aging."""


class ReadyQueue:
    """PENDING jobs ordered by their :meth:`QueueOrder.rank`."""

    def __init__(self, is_live: Callable[[str, int], bool], order: QueueOrder = STRICT) -> None:
        self._heap: list[tuple[float, float, int, str, int]] = []
        self._is_live = is_live
        self._order = order
        self._token = 0

    def push(self, job_id: str, priority: int, ready_at: float, seq: int, owner: str = "") -> int:
        """Queue a job; returns the entry's token (a later push of the same job supersedes it). One
        queue for every owner (control.shares keeps one per owner when owners' shares matter)."""
        self._token += 1
        heapq.heappush(self._heap, (*self._order.rank(priority, ready_at, seq), job_id, self._token))
        return self._token

    def pop(self) -> str | None:
        """The best live job, or None when there is none."""
        heap = self._heap
        while heap:
            _, _, _, job_id, token = heapq.heappop(heap)
            if self._is_live(job_id, token):
                return job_id
        return None

    def drain_live(self, limit: int) -> Iterator[str]:
        """Pop up to ``limit`` live jobs in order (the dispatcher pushes back what it cannot place)."""
        for _ in range(limit):
            job_id = self.pop()
            if job_id is None:
                return
            yield job_id

    def __len__(self) -> int:
        """Heap entries, including ones not yet dropped lazily (an upper bound on live jobs)."""
        return len(self._heap)


class DelayedQueue:
    """SCHEDULED jobs ordered by the time they become ready."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str]] = []
        self._seq = 0

    def push(self, job_id: str, due: float) -> None:
        """Have ``job_id`` come due at ``due`` (Unix seconds). An earlier entry of the job stays: the same job
        may come out of :meth:`pop_due` more than once."""
        self._seq += 1
        heapq.heappush(self._heap, (due, self._seq, job_id))

    def next_due(self) -> float | None:
        """When the earliest entry is due, or None when empty."""
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float, limit: int | None = None) -> list[str]:
        """Remove and return the jobs due at ``now``, earliest first, at most ``limit`` of them
        (callers check the job is still SCHEDULED)."""
        out: list[str] = []
        heap = self._heap
        while heap and heap[0][0] <= now and (limit is None or len(out) < limit):
            out.append(heapq.heappop(heap)[2])
        return out

    def __len__(self) -> int:
        return len(self._heap)


class LeaseQueue:
    """Running leases by the time they end, so that the reaper finds the expired ones without looking
    at every running job (with 100,000 running, that look took about 50 ms of every second's sweep).

    Entries are ``(end, job id, attempt)`` and may be stale: a lease that moved or a job that finished
    leaves its entry behind, and the owner checks each entry it pops against the job. The owner
    rebuilds the queue from the live leases when stale entries come to outnumber them.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, str, int]] = []

    def push(self, ends_at: float, job_id: str, attempt: int) -> None:
        """Note that attempt ``attempt`` of ``job_id`` holds a lease ending at ``ends_at`` (Unix seconds); an
        entry for an earlier lease of the job stays until popped or :meth:`rebuild`."""
        heapq.heappush(self._heap, (ends_at, job_id, attempt))

    def pop_due(self, now: float) -> list[tuple[str, int]]:
        """Remove and return ``(job id, attempt)`` of every entry that ended before ``now``."""
        out: list[tuple[str, int]] = []
        heap = self._heap
        while heap and heap[0][0] < now:
            _, job_id, attempt = heapq.heappop(heap)
            out.append((job_id, attempt))
        return out

    def rebuild(self, leases: Iterator[tuple[float, str, int]]) -> None:
        """Replace every entry with ``leases`` (the live ones)."""
        self._heap = list(leases)
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)
