"""Watchers: who wants to hear about which job's changes (WatchJob streams).

Announcements carry a snapshot of the job taken after the change was committed. Announcing costs
one dict lookup when nobody watches the job.
"""

from __future__ import annotations

import asyncio
import copy

from control.jobs import JobRecord


class Watchers:
    """Per-job subscriber queues."""

    def __init__(self) -> None:
        self._subs: dict[str, list[asyncio.Queue[JobRecord]]] = {}

    def subscribe(self, job_id: str) -> asyncio.Queue[JobRecord]:
        q: asyncio.Queue[JobRecord] = asyncio.Queue()
        self._subs.setdefault(job_id, []).append(q)
        return q

    def unsubscribe(self, job_id: str, q: asyncio.Queue[JobRecord]) -> None:
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
