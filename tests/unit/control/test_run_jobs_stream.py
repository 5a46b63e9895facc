"""A RunJobs stream holds its caller back instead of piling up answers: while MAX_UNANSWERED requests
are without their last answer it takes no more, and takes the next one as soon as one is answered.

On a real Scheduler and SQLite store, with no worker (jobs stay PENDING until cancelled)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from control.api import convert, run_jobs
from control.api.run_jobs import RunJobsStream
from control.clock import FakeClock
from control.config import ControlConfig
from control.jobs import JobRecord, JobState
from control.scheduler import Scheduler
from control.store import SQLiteStore
from corral.errors import Unavailable
from corral.v1 import jobs_pb2
from tests.support.waiting import until


def test_a_stream_takes_no_more_requests_while_too_many_are_unanswered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_jobs, "MAX_UNANSWERED", 3)

    async def main() -> None:
        store = SQLiteStore(str(tmp_path / "c.db"))
        scheduler = Scheduler(store, ControlConfig.from_env({}), FakeClock())
        pulled = 0

        async def requests() -> AsyncIterator[jobs_pb2.RunJobsRequest]:
            nonlocal pulled
            for i in range(6):
                pulled += 1
                yield jobs_pb2.RunJobsRequest(tag=str(i), job=jobs_pb2.SubmitJobRequest(type="noop"))
            await asyncio.Event().wait()  # the caller sends no more, and does not hang up

        async def submit(request: jobs_pb2.SubmitJobRequest) -> JobRecord:
            (job,) = await scheduler.intake.submit([convert.submission(request)])
            return job

        answers: list[jobs_pb2.RunJobsEvent] = []

        async def read() -> None:
            async for event in RunJobsStream(scheduler, submit).events(requests()):
                answers.append(event)

        reader = asyncio.ensure_future(read())
        try:
            # Given a caller that sends 6 requests whose jobs cannot run (no worker)
            await until(lambda: len(answers) == 3, 10, "the first three jobs' first events")
            for _ in range(50):
                await asyncio.sleep(0)
            # Then only 3 were taken (and stored), and the stream read at most one more
            assert scheduler.state_counts()[JobState.PENDING] == 3
            assert pulled <= 4

            # When one of them ends, the next request is taken at once
            await scheduler.actions.cancel(answers[0].event.job.id)
            await until(lambda: len(answers) == 5, 10, "the cancel, then the fourth job's first event")
            assert {a.tag for a in answers} == {"0", "1", "2", "3"}
            assert [a.event.job.state for a in answers if a.tag == "0"][-1] == jobs_pb2.Job.CANCELLED
            assert scheduler.state_counts()[JobState.PENDING] == 3

            # And a stopping control plane ends the stream UNAVAILABLE, though the caller sends nothing
            scheduler.watchers.close()
            with pytest.raises(Unavailable):
                await asyncio.wait_for(reader, 10)
        finally:
            reader.cancel()
            store.close()

    asyncio.run(main())
