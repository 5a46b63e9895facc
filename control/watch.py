"""Watchers: who wants to hear about which job's changes (WatchJob streams).

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
    """Per-job subscriber queues."""

    def __init__(self) -> None:
        self._subs: dict[str, list[asyncio.Queue[JobRecord | None]]] = {}
        self._on_close: set[Callable[[], None]] = set()
        self.closed = False

    def subscribe(self, job_id: str) -> asyncio.Queue[JobRecord | None]:
        """A queue of the job's snapshots; ``None`` in it means "stopping: end the watch".

        Raises:
            Unavailable: the control plane is stopping.
        """
        if self.closed:
            raise Unavailable(SHUTTING_DOWN)
        q: asyncio.Queue[JobRecord | None] = asyncio.Queue()
        self._subs.setdefault(job_id, []).append(q)
        return q

    def unsubscribe(self, job_id: str, q: asyncio.Queue[JobRecord | None]) -> None:
        subs = self._subs.get(job_id)
        if subs is None:
            return
        if q in subs:
            subs.remove(q)
        if not subs:
            del self._subs[job_id]

    def announce(self, job: JobRecord) -> None:
        subs = self._subs.get(job.id)
        if subs:
            snap = copy.copy(job)
            for q in subs:
                q.put_nowait(snap)

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
            for q in subs:
                q.put_nowait(None)
