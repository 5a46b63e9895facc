"""Feeds of jobs: the streams of a job's committed changes (WatchJob, WatchJobs, RunJob) and of what it
prints (WatchOutput).

Each feed starts from the job as it is now and follows the announcements of :mod:`control.watch`
and :mod:`control.live_output`, which the scheduler makes once each change is committed. A stopping
control plane ends every feed with ``Unavailable``: the job goes on, and the caller watches again.
"""

from __future__ import annotations

import asyncio
import copy
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from control.identity import client_identity
from control.jobs import JobRecord, JobState
from control.live_output import LiveOutput
from control.watch import SHUTTING_DOWN, Watchers
from corral.errors import RateLimited, Unavailable
from corral.printed import OutputChunk, PrintedCursor, split_cut_note

PENDING_CHARS = 256 * 1024
"""The most of what a job prints that one output feed holds for a reader that is behind (a client that
stopped reading): a few seconds at the most a runner forwards. Beyond it the oldest is left out, which
the reader sees as a jump in offset."""
PENDING_PIECES = 1024
"""The most pieces of output one feed holds (pieces with text left out between them are not joined)."""

MAX_FEEDS_PER_CLIENT = 5_000
"""Feeds (WatchJob, WatchJobs, WatchOutput, RunJob streams, over gRPC or REST) one client may hold open at
once: the authenticated principal, else the caller's address without its port, as the per-client rate
limit counts (:func:`control.identity.client_identity`). Each costs a task, a queue and gRPC's
buffers, whether or not the client reads what it is sent; a client that opened streams without end
would take the control plane's memory. Past it a new feed is ``RESOURCE_EXHAUSTED`` with a retry-after."""
MAX_WATCHED_PER_CLIENT = 100_000
"""Jobs one client may watch at once across its feeds (a WatchJobs stream counts its ids): ten full
WatchJobs streams. Each watched job costs a listener and the stream's state for it, and its first
event (a whole Job) is built and sent at once: 100 streams of 10,000 ids from one client that never
read took 650 MB and held other clients' calls for up to 15 s."""
MAX_FEEDS = 50_000
"""Feeds open at once across all clients."""
MAX_WATCHED = 1_000_000
"""Jobs watched at once across all feeds."""
RETRY_AFTER_SEC = 1.0
"""The retry-after of a feed refused by those bounds."""


class FeedBudget:
    """The feeds and watched jobs each client holds, within :data:`MAX_FEEDS_PER_CLIENT` and
    :data:`MAX_WATCHED_PER_CLIENT`, and all of them within :data:`MAX_FEEDS` and :data:`MAX_WATCHED`."""

    def __init__(
        self,
        feeds_per_client: int = MAX_FEEDS_PER_CLIENT,
        watched_per_client: int = MAX_WATCHED_PER_CLIENT,
        feeds: int = MAX_FEEDS,
        watched: int = MAX_WATCHED,
    ) -> None:
        self.feeds_per_client = feeds_per_client
        self.watched_per_client = watched_per_client
        self.max_feeds = feeds
        self.max_watched = watched
        self._held: dict[str, list[int]] = {}
        self.feeds = 0
        self.watched = 0

    def take(self, client: str, jobs: int) -> None:
        """Count a feed of ``jobs`` jobs for ``client``; :meth:`give_back` undoes it.

        Raises:
            RateLimited: it would go over a bound (nothing is counted then).
        """
        held = self._held.get(client)
        feeds, watched = held if held is not None else (0, 0)
        over = ""
        if feeds + 1 > self.feeds_per_client:
            over = f"{feeds} open watch streams, the most one client may hold ({client})"
        elif watched + jobs > self.watched_per_client:
            over = (
                f"{watched} watched jobs, and one client may watch at most {self.watched_per_client} at once ({client})"
            )
        elif self.feeds + 1 > self.max_feeds:
            over = f"{self.feeds} open watch streams, the most the control plane holds"
        elif self.watched + jobs > self.max_watched:
            over = f"{self.watched} watched jobs, the most the control plane watches at once"
        if over:
            raise RateLimited(
                f"too many watches: {over}; end some streams, or retry after {RETRY_AFTER_SEC:g}s",
                retry_after=RETRY_AFTER_SEC,
            )
        if held is None:
            self._held[client] = [1, jobs]
        else:
            held[0] += 1
            held[1] += jobs
        self.feeds += 1
        self.watched += jobs

    def give_back(self, client: str, jobs: int) -> None:
        """Undo one :meth:`take`."""
        held = self._held.get(client)
        if held is None:
            return
        held[0] -= 1
        held[1] -= jobs
        if held[0] <= 0:
            del self._held[client]
        self.feeds -= 1
        self.watched -= jobs

    def __len__(self) -> int:
        """Clients holding a feed now."""
        return len(self._held)


class JobFeeds:
    """The feeds of the jobs that ``get`` and ``get_many`` read (memory first, then the store)."""

    def __init__(
        self,
        watchers: Watchers,
        live_output: LiveOutput,
        get: Callable[[str], Awaitable[JobRecord]],
        get_many: Callable[[Sequence[str]], Awaitable[list[JobRecord]]],
        unsettled: Callable[[str], bool],
    ) -> None:
        """``get`` reads a job as committed, ``get_many`` reads many as they are now, and ``unsettled``
        says whether a job carries a change not committed yet (control.unsettled)."""
        self._watchers = watchers
        self._live_output = live_output
        self._get = get
        self._get_many = get_many
        self._unsettled = unsettled
        self.budget = FeedBudget()

    async def watch(self, job_id: str, budgeted: bool = True) -> AsyncIterator[JobRecord]:
        """The job now, then after each committed change, until a terminal state. ``budgeted``: counted
        in the caller's bounds (:class:`FeedBudget`); RunJob and RunJobs follow a job they have just
        submitted, which must not be refused once accepted (a client told "too many" would send it again),
        and what they follow is bounded by the submission limits and per stream instead.

        Raises:
            NotFound: no such job.
            Unavailable: the control plane is stopping (control.watch).
        """
        # watch_many([job_id]) would do the same; this path (WatchJob, RunJob, Client.run) is timed by
        # bench latency, and one queue with no sets or dicts kept it 5-8% quicker (3 alternated runs).
        client = client_identity(None) if budgeted else ""
        if budgeted:
            self.budget.take(client, 1)
        q: asyncio.Queue[JobRecord | None] | None = None
        try:
            q = self._watchers.subscribe(job_id)
            job = copy.copy(await self._get(job_id))  # a snapshot: the live record keeps changing
            last = (job.state, job.attempts, job.updated_at)
            yield job
            while not job.state.terminal:
                update = await q.get()
                if update is None:  # stopping (control.watch)
                    raise Unavailable(SHUTTING_DOWN)
                job = update
                key = (job.state, job.attempts, job.updated_at)
                if key != last:
                    last = key
                    yield job
        finally:
            if q is not None:
                self._watchers.unsubscribe(job_id, q)
            if budgeted:
                self.budget.give_back(client, 1)

    async def watch_many(
        self, job_ids: Sequence[str], ends_only: bool = False, check: Callable[[JobRecord], object] | None = None
    ) -> AsyncIterator[JobRecord]:
        """Each job now (in the order of ``job_ids``), then after each committed change, until every one
        is terminal; with ``ends_only``, only each job's terminal state. ``check`` is called with each job
        before anything is yielded (access rules: it raises to refuse). A job whose last change is not
        committed yet comes first when it is, with the other changes, not in its place among the first.

        Raises:
            NotFound: an id that names no job.
            Unavailable: the control plane is stopping (control.watch).
        """
        client = client_identity(None)
        self.budget.take(client, len(job_ids))
        q: asyncio.Queue[JobRecord | None] = asyncio.Queue()
        listening: list[str] = []
        try:
            for job_id in job_ids:  # before the read: no change after it goes unheard
                self._watchers.listen(job_id, q.put_nowait)
                listening.append(job_id)
            jobs = [copy.copy(job) for job in await self._get_many(job_ids)]
            # Taken with the copies, before any await: the commit of each of these has yet to announce it.
            unsettled = {job.id for job in jobs if self._unsettled(job.id)}
            if check is not None:
                for job in jobs:
                    check(job)
            last: dict[str, tuple[JobState, int, float]] = {}
            for job in jobs:
                if job.id in unsettled:  # not shown before its commit, which announces it
                    continue
                last[job.id] = (job.state, job.attempts, job.updated_at)
                if job.state.terminal or not ends_only:
                    yield job
            waiting = {job.id for job in jobs if job.id in unsettled or not job.state.terminal}
            del jobs, unsettled  # the copies: kept for the whole stream, they were most of its memory
            while waiting:
                update = await q.get()
                if update is None:  # stopping (control.watch)
                    raise Unavailable(SHUTTING_DOWN)
                if update.id not in waiting:
                    continue
                key = (update.state, update.attempts, update.updated_at)
                if key == last.get(update.id):
                    continue
                last[update.id] = key
                if update.state.terminal:
                    waiting.discard(update.id)
                elif ends_only:
                    continue
                yield update
        finally:
            for job_id in listening:
                self._watchers.forget(job_id, q.put_nowait)
            self.budget.give_back(client, len(job_ids))

    async def watch_output(self, job_id: str) -> AsyncIterator[OutputChunk]:
        """What the job prints, until it ends: the end of what its running attempt printed so far (an
        empty chunk when there is none yet), then each piece as it comes; when an attempt stops, what
        its stored output holds beyond what was streamed. Each character once, in order
        (corral.printed); a jump in offset is text left out.

        Raises:
            NotFound: no such job.
            Unavailable: the control plane is stopping (control.watch).
        """
        # One queue for both: a piece an attempt printed comes before the change that ends the attempt.
        client = client_identity(None)
        self.budget.take(client, 1)
        q = _OutputQueue()
        try:
            self._watchers.listen(job_id, q.put)
        except BaseException:
            self.budget.give_back(client, 1)
            raise
        self._live_output.listen(job_id, q.put)
        cursor = PrintedCursor()
        try:
            job = copy.copy(await self._get(job_id))
            backlog = self._live_output.backlog(job_id) if job.state is JobState.RUNNING else None
            chunks = [backlog] if backlog is not None else _stored_output(job)
            if not chunks:  # the first message comes at once, so that the caller knows it was heard
                yield OutputChunk(job.attempts, 0, "")
            while True:
                for chunk in chunks:
                    if (fresh := cursor.take(chunk)) is not None:
                        yield fresh.chunk
                if job.state.terminal:
                    return
                item = await q.get()
                if item is None:  # stopping (control.watch)
                    raise Unavailable(SHUTTING_DOWN)
                if isinstance(item, OutputChunk):
                    chunks = [item]
                else:
                    job = item
                    chunks = _stored_output(job)
        finally:
            self._watchers.forget(job_id, q.put)
            self._live_output.forget(job_id, q.put)
            self.budget.give_back(client, 1)


class _OutputQueue:
    """An output feed's queue: the job's changes and the pieces it printed, in the order they came,
    holding at most :data:`PENDING_CHARS` characters and :data:`PENDING_PIECES` pieces of output. A
    reader that stops reading would otherwise keep everything the job prints from then on in memory.
    Changes are never left out: a job has few, and each matters."""

    def __init__(self) -> None:
        self._items: deque[JobRecord | OutputChunk | None] = deque()
        self._chars = 0
        self._pieces = 0
        self._ready = asyncio.Event()

    def put(self, item: JobRecord | OutputChunk | None) -> None:
        """Queue a change, a piece, or None (stopping); a piece that goes on from the last one queued
        joins it."""
        last = self._items[-1] if self._items else None
        if isinstance(item, OutputChunk):
            if isinstance(last, OutputChunk) and last.attempt == item.attempt and last.end == item.offset:
                self._items[-1] = OutputChunk(last.attempt, last.offset, last.text + item.text)
            else:
                self._items.append(item)
                self._pieces += 1
            self._chars += len(item.text)
            if self._chars > PENDING_CHARS or self._pieces > PENDING_PIECES:
                self._shed()
        else:
            self._items.append(item)
        self._ready.set()

    def _shed(self) -> None:
        """Leave out the oldest output until within both bounds."""
        kept: deque[JobRecord | OutputChunk | None] = deque()
        while self._items:
            item = self._items.popleft()
            if isinstance(item, OutputChunk) and (self._chars > PENDING_CHARS or self._pieces > PENDING_PIECES):
                cut = (
                    len(item.text)
                    if self._pieces > PENDING_PIECES
                    else min(len(item.text), self._chars - PENDING_CHARS)
                )
                self._chars -= cut
                if cut == len(item.text):
                    self._pieces -= 1
                    continue
                item = OutputChunk(item.attempt, item.offset + cut, item.text[cut:])
            kept.append(item)
        self._items = kept

    async def get(self) -> JobRecord | OutputChunk | None:
        """The oldest item, waiting for one."""
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        item = self._items.popleft()
        if isinstance(item, OutputChunk):
            self._chars -= len(item.text)
            self._pieces -= 1
        return item


def _stored_output(job: JobRecord) -> list[OutputChunk]:
    """The stored output of the job's latest attempt as a chunk, once that attempt stopped (none while
    it runs: its live pieces come instead)."""
    if not job.output or job.state is JobState.RUNNING or job.attempts < 1:
        return []
    offset, text = split_cut_note(job.output)
    return [OutputChunk(job.attempts, offset, text)]
