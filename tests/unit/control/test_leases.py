"""Expired leases are found from a queue of lease ends, exactly as a look at every running job would
find them, and the queue stays small however many jobs have come and gone."""

from __future__ import annotations

import asyncio
from pathlib import Path

from control.admission import Submission
from control.clock import FakeClock
from control.config import ControlConfig
from control.jobs import JobState
from control.scheduler import LEASE_SLACK, Scheduler
from control.sessions import Hello, Outcome, Report, WorkerSessions
from control.store import SQLiteStore
from tests.support.links import RecordingLink
from tests.support.waiting import until


async def _turns(n: int = 20) -> None:
    for _ in range(n):  # loop turns, not time: dispatch and commits run on the next ones
        await asyncio.sleep(0)


def test_expired_leases_are_those_a_walk_of_every_running_job_finds(tmp_path: Path) -> None:
    async def main() -> None:
        clock = FakeClock()
        store = SQLiteStore(str(tmp_path / "c.db"))
        scheduler = Scheduler(store, ControlConfig.from_env({"CORRAL_LEASE_GRACE_SEC": "1"}), clock)
        sessions, link = WorkerSessions(scheduler), RecordingLink()
        try:
            # Given 40 jobs running with timeouts of 1..40 s, of which those with odd timeouts finish
            sessions.register(Hello("w1", threads=40, slots=40), link)
            subs = [Submission("noop", {}, payload_json="{}", timeout_sec=t) for t in range(1, 41)]
            await scheduler.intake.submit(subs)
            await _turns()
            assert len(link.assigned) == 40
            finished = [a for a in link.assigned if a.timeout_sec % 2]
            now = clock.now()
            sessions.results("w1", [Report(a.job_id, a.attempt, Outcome.SUCCEEDED, "{}") for a in finished], link)
            await _turns()
            # When time passes, the expired leases are exactly the running jobs whose lease ended
            found: set[str] = set()
            for step in range(45):
                clock.advance(1)
                now = clock.now()
                walk = {j for j in scheduler.running if scheduler.active[j].lease_expires_at < now}  # type: ignore[operator]
                expired = {job.id for job in scheduler.expired_leases(now)}
                assert expired == walk - found, step
                found |= expired
            # Then every even-timeout job expired once, and no finished job did
            assert found == {a.job_id for a in link.assigned if a.timeout_sec % 2 == 0}
        finally:
            store.close()

    asyncio.run(main())


def test_the_lease_queue_stays_small_while_many_short_jobs_come_and_go(tmp_path: Path) -> None:
    async def main() -> None:
        store = SQLiteStore(str(tmp_path / "c.db"))
        scheduler = Scheduler(store, ControlConfig.from_env({}), FakeClock())
        sessions, link = WorkerSessions(scheduler), RecordingLink()
        try:
            # Given a worker with 4 slots that finishes each job at once, for many jobs
            sessions.register(Hello("w1", threads=4, slots=4), link)
            total = 3 * LEASE_SLACK
            await scheduler.intake.submit([Submission("noop", {}, payload_json="{}") for _ in range(total)], batch=True)
            done = 0
            while done < total:
                await _turns(2)
                batch, link.assigned = link.assigned, []
                sessions.results("w1", [Report(a.job_id, a.attempt, Outcome.SUCCEEDED, "{}") for a in batch], link)
                done += len(batch)
                # Then the queue of lease ends stays within twice the most jobs that ran at once (4),
                # plus its slack, instead of growing with every job that came and went
                assert len(scheduler.leases) <= 2 * 4 + LEASE_SLACK + 1
            assert scheduler.state_counts()[JobState.SUCCEEDED] == total
        finally:
            store.close()

    asyncio.run(main())


def test_a_submission_cancelled_during_its_commit_still_sends_what_the_commit_covers(tmp_path: Path) -> None:
    """A commit that suspends (CORRAL_DB_SYNC=full, or PostgreSQL) must not be cut by a caller that goes
    away meanwhile (a client's deadline, a stream closed): what runs after it (assignments, watchers'
    events) belongs to every change the commit covers, not only the caller's."""

    async def main() -> None:
        store = SQLiteStore(str(tmp_path / "c.db"), sync="full")
        scheduler = Scheduler(store, ControlConfig.from_env({}), FakeClock())
        sessions, link = WorkerSessions(scheduler), RecordingLink()
        try:
            # Given a free worker, and a submission whose commit is in flight on the writer thread
            sessions.register(Hello("w1", threads=1, slots=1), link)
            call = asyncio.ensure_future(scheduler.intake.submit([Submission("noop", {}, payload_json="{}")]))
            await _turns(1)
            assert not call.done()
            # When its caller is cancelled before the commit ends
            call.cancel()
            # Then the job, leased in that transaction, still goes to the worker once the commit ends
            await until(lambda: link.assigned, 5.0, "the assignment")
            assert [a.attempt for a in link.assigned] == [1]
            page = await store.list_jobs([JobState.RUNNING], "", 10, 0, ())
            assert [j.id for j in page.jobs] == [link.assigned[0].job_id]  # and the lease is stored
        finally:
            store.close()

    asyncio.run(main())
