"""The queue as users see it (``ListJobs`` with order ``QUEUE``): each PENDING job's place, and when it
should start.

Places follow the ready queue's order (:class:`control.queue.QueueOrder`: priority, aged by
CORRAL_PRIORITY_AGING_SEC, then the time each job became ready), over every PENDING job whoever owns
it, so that a filtered page still says how many jobs go first. What the order does not foresee, the
estimate cannot either: with fair share the owners take turns, and a job that waits for a worker that
runs its type, has its labels, or has a free GPU lets the jobs behind it pass.

The estimated start: at ``r`` starts a second, the ``p``-th job from the front starts about ``p / r`` seconds
from now. The rate is measured, not modelled: every dispatch pass adds its count, and the rate is the
starts of the last :data:`WINDOW_SEC` over the time since the oldest of them (at least a second). It
follows what the fleet does (workers joining or leaving, long jobs and short ones), falls while nothing
starts, and is unknown (no estimate) once nothing has started for a whole window.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from control.jobs import JobRecord
from control.queue import QueueOrder
from control.selection import JobSelection

WINDOW_SEC = 15 * 60.0
"""How far back starts count."""
MAX_PASSES = 4096
"""Dispatch passes kept: the window is shorter when the queue is busy (each pass places many jobs)."""


class DrainRate:
    """The starts of recent dispatch passes, and what they say about the jobs still queued."""

    def __init__(self, window_sec: float = WINDOW_SEC, max_passes: int = MAX_PASSES) -> None:
        """Start with no history (no estimate until a job starts)."""
        if window_sec <= 0 or max_passes < 1:
            raise ValueError(f"window_sec must be > 0 and max_passes >= 1, got {window_sec}, {max_passes}")
        self._window = window_sec
        self._passes: deque[tuple[float, int]] = deque(maxlen=max_passes)
        self._total = 0

    def started(self, now: float, count: int) -> None:
        """A dispatch pass at ``now`` handed ``count`` jobs to workers."""
        if count <= 0:
            return
        if len(self._passes) == self._passes.maxlen:
            self._total -= self._passes[0][1]  # about to fall off the left
        self._passes.append((now, count))
        self._total += count

    def per_second(self, now: float) -> float:
        """Jobs started per second over the window up to ``now``; 0.0 when none started in it."""
        horizon = now - self._window
        while self._passes and self._passes[0][0] < horizon:
            self._total -= self._passes.popleft()[1]
        if not self._passes:
            return 0.0
        return self._total / max(now - self._passes[0][0], 1.0)


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """A PENDING job with its place in the queue (1: next) and its estimated start (None: unknown)."""

    job: JobRecord
    position: int
    estimated_start: float | None


@dataclass(frozen=True, slots=True)
class QueuePage:
    """One page of the queue view and how many queued jobs matched the filters."""

    jobs: list[QueuedJob]
    total: int


def queue_page(
    pending: Sequence[JobRecord],
    order: QueueOrder,
    drain: DrainRate,
    now: float,
    job_type: str = "",
    owners: Sequence[str] = (),
    limit: int = 50,
    offset: int = 0,
    labels: Mapping[str, str] | None = None,
) -> QueuePage:
    """Rank ``pending`` (every PENDING job) and return the page of those of ``job_type`` (any when
    empty) and of ``owners`` (any when empty), ``offset`` places into the matches.

    It costs passes over the queue, and a sort only of the jobs ranked up to the page's last one when a
    filter leaves jobs out (their places count every job before them): a page near the front is cheap
    however long the queue (`bench backlog`'s ``queue_view_ms`` times one at 100,000 queued jobs)."""
    ranks = order.ranks(pending)
    selection = JobSelection(job_type, frozenset(owners), labels=labels or {})
    matches: Sequence[int] = range(len(pending))
    if selection.narrows:
        matches = [i for i, j in enumerate(pending) if selection.matches(j)]
    page = heapq.nsmallest(offset + limit, ((ranks[i], i) for i in matches))[offset:]
    if len(matches) == len(pending):  # every job matches: its place in the page is its place in the queue
        places = list(range(offset + 1, offset + 1 + len(page)))
    else:  # a job's place counts the jobs ranked before it, matched or not; ranks are distinct (seq)
        last = page[-1][0] if page else ()
        ahead = sorted([rank for rank in ranks if rank <= last])  # few for a page near the front
        places = [bisect.bisect_left(ahead, rank) + 1 for rank, _ in page]
    rate = drain.per_second(now)
    return QueuePage(
        [
            QueuedJob(pending[i], place, now + place / rate if rate > 0.0 else None)
            for (_, i), place in zip(page, places, strict=True)
        ],
        len(matches),
    )
