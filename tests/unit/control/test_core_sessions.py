"""Worker sessions around reconnects: what an operator asked of a worker while it was away holds when
it comes back.

On a real Scheduler and SQLite store; the worker is a stand-in link that records what it is sent."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from control.admission import Submission
from control.clock import SystemClock
from control.config import ControlConfig
from control.jobs import JobState
from control.registry import WorkerState
from control.scheduler import Scheduler
from control.sessions import Hello, WorkerSessions
from control.store import SQLiteStore
from tests.support.links import RecordingLink
from tests.support.waiting import until

TURNS = 20
"""Loop turns given for something that must not happen (it would happen in one or two)."""


class DrainRecordingLink(RecordingLink):
    """A RecordingLink that also records the drains it is asked to send."""

    def __init__(self) -> None:
        super().__init__()
        self.drains: list[float] = []

    def drain(self, deadline_sec: float) -> None:
        self.drains.append(deadline_sec)


def test_a_drain_asked_while_the_worker_was_away_holds_when_it_reconnects(tmp_path: Path) -> None:
    """DrainWorker on a worker whose stream had dropped marked it draining, but its reconnection
    cleared that: the worker was never told, took new jobs, and the drain (an operator's, or the
    autoscaler's before it removes the container) was silently undone."""

    async def main() -> None:
        store = SQLiteStore(str(tmp_path / "c.db"))
        scheduler = Scheduler(store, ControlConfig.from_env({}), SystemClock())
        sessions = WorkerSessions(scheduler)
        try:
            # Given a worker running a job, whose stream drops
            first = DrainRecordingLink()
            sessions.register(Hello("w1", threads=2, slots=2, hostname="h", pid=7), first)
            (running,) = await scheduler.intake.submit([Submission("sleep", {"seconds": 60}, payload_json="{}")])
            await until(lambda: bool(first.assigned), 5, "the job to be leased")
            sessions.disconnected("w1", first)
            # When it is drained while away, and then comes back with its job
            sessions.drain("w1", 30.0)
            again = DrainRecordingLink()
            key = (running.id, running.attempts)
            sessions.register(Hello("w1", threads=2, slots=2, hostname="h", pid=7, running={key: 1}), again)
            # Then it is still draining, is told so on its new stream, and is given nothing new
            worker = scheduler.registry.get("w1")
            assert worker is not None and worker.state is WorkerState.DRAINING
            assert len(again.drains) == 1 and 0 < again.drains[0] <= 30.0
            (fresh,) = await scheduler.intake.submit([Submission("noop", {}, payload_json="{}")])
            for _ in range(TURNS):
                await asyncio.sleep(0)
            assert fresh.state is JobState.PENDING and again.assigned == []
            assert running.state is JobState.RUNNING  # its own job goes on
        finally:
            store.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("since", "lost"),
    [
        ("first registration", False),  # the process that held the id when it was leased: it never got it
        ("never", True),  # a new process: the old one may have run it
        ("after the lease", True),  # this process came after the lease: another one held the id then
    ],
)
def test_an_attempt_missing_from_a_reconnection_is_lost_only_if_another_process_may_have_had_it(
    tmp_path: Path, since: str, lost: bool
) -> None:
    """An assignment lost with a stream (or with a control plane killed before sending it) cost the job
    an attempt as WORKER_LOST: a job with one attempt ended FAILED without having run."""

    async def main() -> None:
        store = SQLiteStore(str(tmp_path / "c.db"))
        scheduler = Scheduler(store, ControlConfig.from_env({}), SystemClock())
        sessions = WorkerSessions(scheduler)
        try:
            # Given a worker process registered at some time, and a job with one attempt leased to it
            registered_at = scheduler.clock.now()
            first = RecordingLink()
            sessions.register(Hello("w1", threads=1, slots=1, hostname="h", pid=7), first)
            (job,) = await scheduler.intake.submit([Submission("noop", {}, payload_json="{}", max_attempts=1)])
            await until(lambda: bool(first.assigned), 5, "the job to be leased")
            sessions.disconnected("w1", first)
            # When a process with that id registers again, listing neither running nor finished it
            again = RecordingLink()
            told = {"first registration": registered_at, "never": 0.0, "after the lease": scheduler.clock.now()}
            sessions.register(Hello("w1", threads=1, slots=1, hostname="h", pid=7, registered_since=told[since]), again)
            if lost:
                # Then the attempt is lost, and with it the job's only one
                assert (job.state, job.error_code) == (JobState.FAILED, "WORKER_LOST")
            else:
                # Then it goes back in line uncharged, and is given to the worker again
                assert job.charged_attempts == 0 and job.error_code == ""
                await until(lambda: bool(again.assigned), 5, "the job to be leased again")
                assert job.state is JobState.RUNNING and job.attempts == 2
        finally:
            store.close()

    asyncio.run(main())
