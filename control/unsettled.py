"""Which live jobs carry a change that is queued to the store but not committed yet.

A change is made in memory first and committed after. Until its commit ends, a crash would undo it, so
nobody may be told of it: announcements and acknowledgements already wait for the commit, and reads of
a job (GetJob, the first event of a WatchJob) ask here whether they must wait for one too.

Commits are numbered in the order they take the queued writes. A store commits in that order, so once
commit ``n`` ends, every write queued before it was taken is durable, whichever commit carried it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from control.jobs import JobRecord


class Unsettled:
    """The ids of jobs whose last queued write is not committed yet."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}
        """Job id -> the number of the commit that takes its last write."""
        self._taken_by_next: list[str] = []
        self._next = 0

    def wrote(self, changed: Iterable[JobRecord]) -> None:
        """Note writes of ``changed`` just queued to the store: they go with the next commit."""
        number, last, taken = self._next, self._last, self._taken_by_next
        for job in changed:
            last[job.id] = number
            taken.append(job.id)

    def taking(self) -> Callable[[], None]:
        """A commit takes the writes queued so far: returns what to call once it has ended well (after a
        failed commit, nothing: the jobs stay unsettled, and a read waits for a commit that raises)."""
        number, ids = self._next, self._taken_by_next
        self._next += 1
        self._taken_by_next = []
        if not ids:
            return _nothing
        last = self._last

        def settled() -> None:
            for job_id in ids:
                if last.get(job_id) == number:  # not written again since
                    del last[job_id]

        return settled

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._last

    def __len__(self) -> int:
        return len(self._last)


def _nothing() -> None:
    pass
