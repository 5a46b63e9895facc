"""Worker sessions around reconnects: what an operator asked of a worker while it was away holds when
it comes back.

On a real Scheduler and SQLite store; the worker is a stand-in link that records what it is sent."""

from __future__ import annotations

import asyncio
from pathlib import Path

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
