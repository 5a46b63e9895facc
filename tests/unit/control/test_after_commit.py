"""What a commit releases goes out in the order that keeps workers busy: a result that frees a slot
sends that worker its next assignment before the job's watchers are answered, and the watchers still
hear of the changes in the order they were made."""

from __future__ import annotations

import asyncio
from pathlib import Path

from control.admission import Submission
from control.api.workers import GrpcLink
from control.clock import SystemClock
from control.config import ControlConfig
from control.jobs import JobState
from control.scheduler import Scheduler
from control.sessions import Hello, Outcome, Report, WorkerSessions
from control.store import SQLiteStore
from tests.support.waiting import until


def test_the_next_assignment_is_written_before_the_finished_jobs_watchers_are_answered(tmp_path: Path) -> None:
    async def main() -> None:
        store = SQLiteStore(str(tmp_path / "c.db"))
        scheduler = Scheduler(store, ControlConfig.from_env({}), SystemClock())
        sessions, link = WorkerSessions(scheduler), GrpcLink()
        order: list[str] = []
        attempts: dict[str, int] = {}

        async def writer() -> None:  # the stream's writer loop, as WorkerServicer.Connect runs it
            async for message in link.outgoing():
                for a in message.assign.assignments:
                    attempts[a.job_id] = a.attempt
                    order.append(f"assign {a.job_id}")

        async def watcher(job_id: str) -> None:  # a WatchJob client of the first job
            async for job in scheduler.feeds.watch(job_id):
                if job.state.terminal:
                    order.append(f"ended {job_id}")

        seen: list[tuple[str, JobState]] = []

        async def both(job_ids: list[str]) -> None:  # a WatchJobs client of the two
            async for job in scheduler.feeds.watch_many(job_ids):
                seen.append((job.id, job.state))

        tasks = [asyncio.ensure_future(writer())]
        try:
            # Given a one-slot worker running the first of two jobs, a client watching that job and one
            # watching both
            sessions.register(Hello("w1", threads=1, slots=1), link)
            first, second = await scheduler.intake.submit([Submission("noop", {}, payload_json="{}")] * 2)
            await until(lambda: order == [f"assign {first.id}"])
            tasks.append(asyncio.ensure_future(watcher(first.id)))
            tasks.append(asyncio.ensure_future(both([first.id, second.id])))
            await until(lambda: len(seen) == 2)  # each job as it is now
            # When its result comes, which frees the slot for the second
            sessions.results("w1", [Report(first.id, attempts[first.id], Outcome.SUCCEEDED, "{}")], link)
            await until(lambda: len(order) == 3)
            # Then the worker's assignment goes out first: its slot waits on it, the watcher does not
            assert order == [f"assign {first.id}", f"assign {second.id}", f"ended {first.id}"]
            # And a watcher of both hears the first end before the second start, as they were made
            await until(lambda: len(seen) == 4)
            assert seen[2:] == [(first.id, JobState.SUCCEEDED), (second.id, JobState.RUNNING)]
        finally:
            for task in tasks:
                task.cancel()
            link.close()
            store.close()

    asyncio.run(main())
