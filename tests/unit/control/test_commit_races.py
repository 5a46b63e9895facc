"""What happens while a commit is under way: a second change to the same job, a worker that comes back on
a new stream, a cancel that follows an assignment, a job held for want of room that another event frees.

Commits are held up as in production, by another connection holding SQLite's write lock (with
CORRAL_DB_SYNC=full every commit goes to the store's writer thread, as every commit does on PostgreSQL);
where two commits must end apart, the writer thread is also given a task that waits, between them."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from control.admission import Submission
from control.api.workers import GrpcLink
from control.clock import SystemClock
from control.config import ControlConfig
from control.jobs import JobState
from control.registry import Assignment
from control.scheduler import Scheduler
from control.sessions import Hello, WorkerSessions
from control.store import SQLiteStore
from tests.support.links import RecordingLink
from tests.support.waiting import until

TURNS = 20
"""Loop turns given for something that must not happen (it would happen in one or two)."""


@dataclass
class Plane:
    """A scheduler on a SQLite store whose commits a test can hold up."""

    db: Path
    store: SQLiteStore
    scheduler: Scheduler
    sessions: WorkerSessions
    blocker: sqlite3.Connection

    def committed(self, job_id: str) -> JobState:
        """The job's state as stored (committed)."""
        with sqlite3.connect(self.db) as conn:
            (state,) = conn.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return JobState(state)

    def hold_commits(self) -> None:
        """Commits from now on wait (the write lock is another connection's)."""
        self.blocker.execute("BEGIN IMMEDIATE")

    def release_commits(self) -> None:
        self.blocker.execute("ROLLBACK")

    def gate_writer(self) -> threading.Event:
        """Make the store's writer thread wait, after what it was given so far, until the event is set:
        the commits handed to it later end only then."""
        gate = threading.Event()
        self.store._writer.submit(gate.wait)
        return gate


@asynccontextmanager
async def plane(tmp_path: Path, **env: str) -> AsyncIterator[Plane]:
    db = tmp_path / "c.db"
    store = SQLiteStore(str(db), sync="full")
    scheduler = Scheduler(store, ControlConfig.from_env({"CORRAL_DB_SYNC": "full", **env}), SystemClock())
    blocker = sqlite3.connect(db, isolation_level=None)
    try:
        yield Plane(db, store, scheduler, WorkerSessions(scheduler), blocker)
    finally:
        blocker.close()
        store.close()


async def turns() -> None:
    for _ in range(TURNS):
        await asyncio.sleep(0)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())  # type: ignore[arg-type]  # an async def's coroutine


def test_a_watcher_is_not_told_a_change_made_after_the_one_a_commit_carries(tmp_path: Path) -> None:
    async def main() -> None:
        async with plane(tmp_path) as p:
            # Given a queued job, committed, and a client watching it
            (job,) = await p.scheduler.intake.submit([Submission("sleep", {"seconds": 60}, payload_json="{}")])
            seen: list[JobState] = []

            async def watch() -> None:
                async for event in p.scheduler.feeds.watch(job.id):
                    seen.append(event.state)

            watcher = asyncio.ensure_future(watch())
            await until(lambda: seen == [JobState.PENDING])
            # When a worker comes and the job's lease is being committed, and a cancel follows whose
            # commit ends only later
            p.hold_commits()
            p.sessions.register(Hello("w1", threads=1, slots=1), RecordingLink())
            await until(lambda: job.state is JobState.RUNNING)
            await turns()  # the lease's commit is on the writer thread
            gate = p.gate_writer()
            cancel = asyncio.ensure_future(p.scheduler.actions.cancel(job.id))
            await until(lambda: job.state is JobState.CANCELLED)
            p.release_commits()
            await until(lambda: p.committed(job.id) is JobState.RUNNING, what="the lease's commit")
            await turns()
            # Then the lease's commit does not tell the watcher the cancel it does not carry
            assert seen == [JobState.PENDING], "told CANCELLED before the cancel was committed"
            assert job.id in p.scheduler.active
            # and the cancel's own commit does
            gate.set()
            await asyncio.wait_for(cancel, 10)
            await asyncio.wait_for(watcher, 10)
            assert seen[-1] is JobState.CANCELLED and p.committed(job.id) is JobState.CANCELLED
            assert job.id not in p.scheduler.active

    run(main)


def test_a_worker_back_on_a_new_stream_while_its_lease_is_committed_gets_the_job_and_loses_nothing(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with plane(tmp_path) as p:
            first = RecordingLink()
            p.sessions.register(Hello("w1", threads=1, slots=1), first)
            # Given a job leased to the worker, its lease (with the job) still being committed
            p.hold_commits()
            submit = asyncio.ensure_future(
                p.scheduler.intake.submit([Submission("sleep", {"seconds": 60}, payload_json="{}", max_attempts=1)])
            )
            await until(lambda: p.scheduler.state_counts()[JobState.RUNNING] == 1)
            # When the worker's stream drops and it comes back, running nothing, before that commit ends
            p.sessions.disconnected("w1", first)
            second = RecordingLink()
            p.sessions.register(Hello("w1", threads=1, slots=1), second)
            p.release_commits()
            (job,) = await asyncio.wait_for(submit, 10)
            # Then the assignment goes out on the new stream, and the attempt, which never reached the
            # worker, is not charged as lost (with one attempt, that failed the job)
            await until(lambda: len(second.assigned) == 1)
            assert (second.assigned[0].job_id, second.assigned[0].attempt) == (job.id, 1)
            assert first.assigned == []
            assert (job.state, job.attempts) == (JobState.RUNNING, 1)
            assert p.committed(job.id) is JobState.RUNNING

    run(main)


def test_assignments_go_out_before_a_cancel_queued_after_them() -> None:
    async def main() -> None:
        link = GrpcLink()
        link.assign([Assignment("j1", 1, "sleep", "{}", 1, 60.0, 0)])
        link.cancel("j1", 1)
        kinds: list[str] = []
        async for message in link.outgoing():
            kinds.append(
                "assign" if message.assign.assignments else "cancel" if message.HasField("cancel") else "other"
            )
            if len(kinds) == 2:
                break
        # A worker drops a Cancel of an attempt it has not been given, and would then run it to its end
        assert kinds == ["assign", "cancel"]

    run(main)


def test_an_owner_s_job_held_by_its_running_limit_starts_when_a_running_one_is_cancelled(tmp_path: Path) -> None:
    async def main() -> None:
        async with plane(tmp_path, CORRAL_OWNER_MAX_RUNNING="1") as p:
            links = {name: RecordingLink() for name in ("w1", "w2")}
            for name, link in links.items():
                p.sessions.register(Hello(name, threads=1, slots=1), link)
            sleep = Submission("sleep", {"seconds": 60}, payload_json="{}")
            first, second = await p.scheduler.intake.submit([sleep, sleep], owner="alice")
            await until(lambda: sum(len(link.assigned) for link in links.values()) == 1)
            assert (first.state, second.state) == (JobState.RUNNING, JobState.PENDING)  # alice may run one
            # When the running one is cancelled, and its worker does not answer (hung, or gone)
            await p.scheduler.actions.cancel(first.id)
            # Then the other starts on the idle worker: it waited for nothing else
            await until(lambda: second.state is JobState.RUNNING, 5, "the held job to start")

    run(main)


def test_a_job_sized_for_a_draining_worker_starts_on_another_once_it_has_left(tmp_path: Path) -> None:
    async def main() -> None:
        async with plane(tmp_path) as p:
            big, small = RecordingLink(), RecordingLink()
            p.sessions.register(Hello("big", threads=8, slots=1), big)
            p.sessions.register(Hello("small", threads=2, slots=1), small)
            p.sessions.draining("big")
            # Given a job that asks for 8 threads while the only 8-thread worker drains
            (job,) = await p.scheduler.intake.submit(
                [Submission("sleep", {"seconds": 60}, payload_json="{}", thread_demand=8)]
            )
            await turns()
            assert job.state is JobState.PENDING and small.assigned == []
            # When that worker leaves
            p.sessions.disconnected("big", big)
            # Then the job runs on the other with the threads it has
            await until(lambda: small.assigned, 5, "the job to start on the 2-thread worker")
            assert [(a.job_id, a.threads) for a in small.assigned] == [(job.id, 2)]

    run(main)
