"""Watchers: who wants to hear about which job's changes (WatchJob, RunJob and WatchOutput streams).

Announcements carry a snapshot of the job taken after the change was committed. Announcing costs
one dict lookup when nobody watches the job.

A stopping control plane ends every watch (:meth:`Watchers.close`), and every RunJobs stream
(:meth:`Watchers.on_close`): a stream that would only end at
its job's end would otherwise hold the stop for the whole shutdown grace and then be cut. Each one
ends with ``UNAVAILABLE`` instead, which clients take as "watch again" (the job goes on, and the
Python client re-watches on its own, ``corral.follow``).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable

from control.jobs import JobRecord
from corral.errors import Unavailable

SHUTTING_DOWN = "the control plane is shutting down: watch again once it is back (the job goes on)"


class Watchers:
    """Per-job listeners: each one a function that takes the job's snapshots (``None``: stopping)."""

    def __init__(self) -> None:
        self._subs: dict[str, list[Callable[[JobRecord | None], None]]] = {}
        self._on_close: set[Callable[[], None]] = set()
        self.closed = False
        self.listening = 0
        """Listeners now, one per job per stream (``corral_watched_jobs``): a stream that ended and
        left its jobs behind would show here as a count that never falls back."""

    def subscribe(self, job_id: str) -> asyncio.Queue[JobRecord | None]:
        """A queue of the job's snapshots; ``None`` in it means "stopping: end the watch".

        Raises:
            Unavailable: the control plane is stopping.
        """
        q: asyncio.Queue[JobRecord | None] = asyncio.Queue()
        self.listen(job_id, q.put_nowait)
        return q

    def unsubscribe(self, job_id: str, q: asyncio.Queue[JobRecord | None]) -> None:
        """Undo :meth:`subscribe` (nothing to undo when ``q`` no longer listens)."""
        self.forget(job_id, q.put_nowait)

    def listen(self, job_id: str, put: Callable[[JobRecord | None], None]) -> None:
        """Have ``put`` called with each snapshot of the job, and with ``None`` when the control plane
        stops (a WatchOutput stream puts them into the queue it also reads live output from).

        Raises:
            Unavailable: the control plane is stopping.
        """
        if self.closed:
            raise Unavailable(SHUTTING_DOWN)
        self._subs.setdefault(job_id, []).append(put)
        self.listening += 1

    def forget(self, job_id: str, put: Callable[[JobRecord | None], None]) -> None:
        """Undo :meth:`listen`."""
        subs = self._subs.get(job_id)
        if subs is None:
            return
        if put in subs:
            subs.remove(put)
            self.listening -= 1
        if not subs:
            del self._subs[job_id]

    def announce(self, job: JobRecord) -> None:
        """Give each listener of ``job`` a snapshot of it taken now; call once its change is committed. One
        shallow copy, shared by every listener: they must not change it."""
        subs = self._subs.get(job.id)
        if subs:
            snap = copy.copy(job)
            for put in subs:
                put(snap)

    def on_close(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Have ``callback`` called when the control plane stops (a RunJobs stream, which may be waiting
        for its caller's next request rather than for a job); returns what forgets it again. Called at
        once when the control plane is already stopping."""
        if self.closed:
            callback()
            return lambda: None
        self._on_close.add(callback)
        return lambda: self._on_close.discard(callback)

    def close(self) -> None:
        """End every watch and refuse new ones (the control plane is stopping)."""
        self.closed = True
        for callback in list(self._on_close):
            callback()
        self._on_close.clear()
        for subs in self._subs.values():
            for put in subs:
                put(None)
