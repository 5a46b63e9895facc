"""Reads of a job show it as committed: a change still on its way to the store is not shown until its
commit ends, since a crash before then would undo what the reader saw (a GetJob that said CANCELLED, then
the job running after a restart).

The commit is held up the way it is in production: another connection holds SQLite's write lock, so the
store's writer waits for it (CORRAL_DB_SYNC=full sends every commit to that thread, as PostgreSQL does)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from control.admission import Submission
from control.clock import SystemClock
from control.config import ControlConfig
from control.jobs import JobRecord, JobState
from control.scheduler import Scheduler
from control.sessions import Hello, Outcome, Report, WorkerSessions
from control.store import SQLiteStore
from control.unsettled import Unsettled
from corral.errors import FailedPrecondition
from tests.support.links import RecordingLink
from tests.support.waiting import until

TURNS = 20
"""Loop turns a read is given to answer while the commit is held: without the wait it answers in one."""


async def _first(job_id: str, scheduler: Scheduler) -> JobRecord:
    async for job in scheduler.feeds.watch(job_id):
        return job
    raise AssertionError("the watch ended without an event")


async def _first_of_many(job_id: str, scheduler: Scheduler) -> JobRecord:
    async for job in scheduler.feeds.watch_many([job_id]):
        return job
    raise AssertionError("the watch ended without an event")


READS: dict[str, Callable[[str, Scheduler], Awaitable[JobRecord]]] = {
    "get": lambda job_id, s: s.get(job_id),
    "watch": _first,
    "watch_many": _first_of_many,
}


def _committed_state(db: Path, job_id: str) -> JobState:
    with sqlite3.connect(db) as conn:
        (state,) = conn.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
    return JobState(state)


def test_reads_wait_for_the_commit_of_a_change_and_then_show_it(tmp_path: Path) -> None:
    db = tmp_path / "c.db"

    async def main() -> None:
        store = SQLiteStore(str(db), sync="full")
        scheduler = Scheduler(store, ControlConfig.from_env({"CORRAL_DB_SYNC": "full"}), SystemClock())
        sessions, link = WorkerSessions(scheduler), RecordingLink()
        blocker = sqlite3.connect(db, isolation_level=None)
        try:
            # Given a job running on a worker, committed
            sessions.register(Hello("w1", threads=1, slots=1), link)
            (job,) = await scheduler.intake.submit([Submission("sleep", {"seconds": 60}, payload_json="{}")])
            await until(lambda: [a.job_id for a in link.assigned] == [job.id])
            await until(lambda: _committed_state(db, job.id) is JobState.RUNNING)
            # When it is cancelled while the store's writer cannot commit
            blocker.execute("BEGIN IMMEDIATE")
            cancel = asyncio.ensure_future(scheduler.actions.cancel(job.id))
            await until(lambda: job.state is JobState.CANCELLED)  # changed in memory, queued to the store
            reads: dict[str, asyncio.Future[Any]] = {
                name: asyncio.ensure_future(read(job.id, scheduler)) for name, read in READS.items()
            }
            for _ in range(TURNS):
                await asyncio.sleep(0)
            # Then no read shows the change while it could still be undone
            assert _committed_state(db, job.id) is JobState.RUNNING
            answered = {name: f.result().state for name, f in reads.items() if f.done()}
            assert answered == {}, f"shown before its commit: {answered}"
            assert not cancel.done()
            # and once it is committed, every read shows it
            blocker.execute("ROLLBACK")
            await asyncio.wait_for(cancel, 10)
            assert {name: (await asyncio.wait_for(f, 10)).state for name, f in reads.items()} == dict.fromkeys(
                READS, JobState.CANCELLED
            )
            assert _committed_state(db, job.id) is JobState.CANCELLED
            # and a read with nothing to wait for answers at once
            assert (await scheduler.get(job.id)).state is JobState.CANCELLED
            assert len(scheduler.unsettled) == 0
        finally:
            blocker.close()
            store.close()

    asyncio.run(main())


@pytest.mark.parametrize("action", ["retry", "cancel", "depend"])
def test_a_retry_or_a_cancel_sent_while_a_failure_is_being_committed_answers_as_committed(
    tmp_path: Path, action: str
) -> None:
    db = tmp_path / "c.db"

    async def main() -> None:
        store = SQLiteStore(str(db), sync="full")
        scheduler = Scheduler(store, ControlConfig.from_env({"CORRAL_DB_SYNC": "full"}), SystemClock())
        sessions, link = WorkerSessions(scheduler), RecordingLink()
        blocker = sqlite3.connect(db, isolation_level=None)
        try:
            # Given a job with one attempt, running
            sessions.register(Hello("w1", threads=1, slots=1), link)
            (job,) = await scheduler.intake.submit(
                [Submission("sleep", {"seconds": 60}, payload_json="{}", max_attempts=1)]
            )
            await until(lambda: len(link.assigned) == 1)
            await until(lambda: _committed_state(db, job.id) is JobState.RUNNING)
            # When it fails while the store's writer cannot commit, and a retry or a cancel comes meanwhile
            blocker.execute("BEGIN IMMEDIATE")
            (a,) = link.assigned
            sessions.results("w1", [Report(job.id, a.attempt, Outcome.FAILED, "", "ERROR", "boom")], link)
            await until(lambda: job.state is JobState.FAILED)
            call: asyncio.Future[Any]
            if action == "depend":  # a job that may start only once it has succeeded
                dependent = Submission("noop", {}, payload_json="{}", depends_on=(job.id,))
                call = asyncio.ensure_future(scheduler.intake.submit([dependent]))
            else:
                call = asyncio.ensure_future(getattr(scheduler.actions, action)(job.id))
            for _ in range(TURNS):
                await asyncio.sleep(0)
            # Then it is not answered while the failure could still be undone
            assert not call.done(), "answered before the failure was stored"
            blocker.execute("ROLLBACK")
            # and then as committed: a retry re-drives it (it was refused with "it is FAILED; only FAILED
            # jobs can be retried"), a cancel says it has failed, a job that depends on it is refused
            if action == "retry":
                retried = await asyncio.wait_for(call, 10)
                assert retried.id == job.id and retried.state in (JobState.PENDING, JobState.RUNNING)
                await until(lambda: _committed_state(db, job.id) in (JobState.PENDING, JobState.RUNNING))
            else:
                with pytest.raises(FailedPrecondition, match="is FAILED"):
                    await asyncio.wait_for(call, 10)
                assert _committed_state(db, job.id) is JobState.FAILED
                assert scheduler.state_counts()[JobState.PENDING] == 0  # nothing was made
        finally:
            blocker.close()
            store.close()

    asyncio.run(main())


def test_a_job_written_again_while_a_commit_is_under_way_stays_unsettled_until_the_commit_of_its_last_write() -> None:
    a, b = JobRecord.__new__(JobRecord), JobRecord.__new__(JobRecord)
    a.id, b.id = "a", "b"
    unsettled = Unsettled()
    unsettled.wrote([a, b])
    first = unsettled.taking()  # a commit takes both writes
    unsettled.wrote([a])  # a changes again: its new write waits for the next commit
    first()
    assert ("a" in unsettled, "b" in unsettled) == (True, False)
    second = unsettled.taking()
    second()
    assert len(unsettled) == 0


def test_a_watch_of_many_shows_the_settled_ones_at_once_and_one_being_committed_once_it_is(tmp_path: Path) -> None:
    db = tmp_path / "c.db"

    async def main() -> None:
        store = SQLiteStore(str(db), sync="full")
        scheduler = Scheduler(store, ControlConfig.from_env({"CORRAL_DB_SYNC": "full"}), SystemClock())
        blocker = sqlite3.connect(db, isolation_level=None)
        try:
            # Given two queued jobs, the first one being cancelled while the writer cannot commit
            sleep = Submission("sleep", {"seconds": 60}, payload_json="{}")
            changing, steady = await scheduler.intake.submit([sleep, sleep])
            blocker.execute("BEGIN IMMEDIATE")
            cancel = asyncio.ensure_future(scheduler.actions.cancel(changing.id))
            await until(lambda: changing.state is JobState.CANCELLED)
            # When both are watched
            seen: list[tuple[str, JobState]] = []

            async def watch() -> None:
                async for job in scheduler.feeds.watch_many([changing.id, steady.id]):
                    seen.append((job.id, job.state))

            watcher = asyncio.ensure_future(watch())
            # Then the one with nothing on its way shows at once (a busy set of jobs, some always
            # changing, does not hold up the others), and the other does not show yet
            await until(lambda: seen == [(steady.id, JobState.PENDING)])
            for _ in range(TURNS):
                await asyncio.sleep(0)
            assert seen == [(steady.id, JobState.PENDING)]
            # and does once its cancel is committed
            blocker.execute("ROLLBACK")
            await asyncio.wait_for(cancel, 10)
            await until(lambda: len(seen) == 2)
            assert seen[1] == (changing.id, JobState.CANCELLED)
            assert _committed_state(db, changing.id) is JobState.CANCELLED
            watcher.cancel()
        finally:
            blocker.close()
            store.close()

    asyncio.run(main())
