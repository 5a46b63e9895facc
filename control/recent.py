"""RecentJobs: the last jobs to finish, kept in memory so that reading them needs no store query.

A client that submits and then waits (WatchJob, GetJob) most often asks about a job that has just
finished. Live jobs are in memory already (``Scheduler.active``); once finished a job leaves them,
and without this a read would go to the store on its reader thread, a thread hop that cost about a
tenth of a submit-to-result round trip. Bounded by count and by the bytes of payload, result and
error text, so a burst of large results cannot make the control plane grow.
"""

from __future__ import annotations

from collections import OrderedDict

from control.jobs import JobRecord

MAX_JOBS = 4096
"""Finished jobs kept at most."""
MAX_BYTES = 16 << 20
"""Payload, result and error text kept at most, in bytes (a larger job is simply not kept)."""


def _size(job: JobRecord) -> int:
    return len(job.payload_json) + len(job.result_json) + len(job.error_message)


class RecentJobs:
    """Least recently finished first out; a job read here is the committed, finished record."""

    def __init__(self, max_jobs: int = MAX_JOBS, max_bytes: int = MAX_BYTES) -> None:
        self._jobs: OrderedDict[str, tuple[JobRecord, int]] = OrderedDict()  # with the size it was counted at
        self._bytes = 0
        self.max_jobs = max_jobs
        self.max_bytes = max_bytes

    def __len__(self) -> int:
        return len(self._jobs)

    @property
    def bytes(self) -> int:
        """Payload, result and error text held now."""
        return self._bytes

    def add(self, job: JobRecord) -> None:
        """Keep ``job`` (finished and committed), dropping the oldest ones past the bounds."""
        self.discard(job.id)
        size = _size(job)
        if size > self.max_bytes // 64:  # a few large jobs must not push out many small ones
            return
        self._jobs[job.id] = (job, size)
        self._bytes += size
        while len(self._jobs) > self.max_jobs or self._bytes > self.max_bytes:
            _, (_, old_size) = self._jobs.popitem(last=False)
            self._bytes -= old_size

    def get(self, job_id: str) -> JobRecord | None:
        """The finished job, if it is still kept."""
        entry = self._jobs.get(job_id)
        return entry[0] if entry is not None else None

    def discard(self, job_id: str) -> None:
        """Forget ``job_id`` (it is live again: RetryJob re-drove it)."""
        old = self._jobs.pop(job_id, None)
        if old is not None:
            self._bytes -= old[1]
