"""Log lines of a job's changes come once the change is committed: a line for a change that a failed
commit undid said it happened (after a disk full, one job had three ``job_completed`` lines and four
``job_dispatched`` lines named leases that never reached the disk).

The commit is held up as in tests/unit/control/test_reads_committed.py: another connection holds
SQLite's write lock (CORRAL_DB_SYNC=full sends every commit to the writer's thread)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path

import pytest

from control.admission import Submission
from control.clock import SystemClock
from control.config import ControlConfig
from control.scheduler import Scheduler
from control.sessions import Hello, Outcome, Report, WorkerSessions
from control.store import SQLiteStore
from tests.support.links import RecordingLink
from tests.support.waiting import until

TURNS = 20


def _events(caplog: pytest.LogCaptureFixture, event: str) -> list[str]:
    return [r.job_id for r in caplog.records if r.getMessage() == event]  # type: ignore[attr-defined]


@pytest.mark.parametrize("outcome", [Outcome.SUCCEEDED, Outcome.FAILED, Outcome.HANDED_BACK])
def test_a_lease_and_a_result_are_logged_once_committed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, outcome: Outcome
) -> None:
    db = tmp_path / "c.db"
    caplog.set_level(logging.INFO)
    event = {Outcome.SUCCEEDED: "job_completed", Outcome.FAILED: "job_retry_scheduled"}.get(outcome, "job_requeued")

    async def main() -> None:
        store = SQLiteStore(str(db), sync="full")
        scheduler = Scheduler(store, ControlConfig.from_env({"CORRAL_DB_SYNC": "full"}), SystemClock())
        sessions, link = WorkerSessions(scheduler), RecordingLink()
        blocker = sqlite3.connect(db, isolation_level=None)
        try:
            (job,) = await scheduler.intake.submit([Submission("noop", {}, payload_json="{}", max_attempts=3)])
            # Given its lease held up on its way to the store (the worker comes once the store is blocked)
            blocker.execute("BEGIN IMMEDIATE")
            sessions.register(Hello("w1", threads=1, slots=1), link)
            for _ in range(TURNS):
                await asyncio.sleep(0)
            # Then it is not logged dispatched until the lease is committed
            assert _events(caplog, "job_dispatched") == []
            blocker.execute("ROLLBACK")
            await until(lambda: [a.job_id for a in link.assigned] == [job.id])
            assert _events(caplog, "job_dispatched") == [job.id]
            # When its result comes while the store cannot commit
            blocker.execute("BEGIN IMMEDIATE")
            sessions.results("w1", [Report(job.id, 1, outcome, "{}", started_at=1.0, finished_at=2.0)], link)
            for _ in range(TURNS):
                await asyncio.sleep(0)
            # Then nothing says so until its commit
            assert _events(caplog, event) == []
            blocker.execute("ROLLBACK")
            await until(lambda: _events(caplog, event) == [job.id])
        finally:
            blocker.close()
            store.close()

    asyncio.run(main())
