"""What must follow a committed change happens even when the caller that waited for the commit has gone
(a client's deadline, a closed stream) before the commit ended: the commit, not the caller, carries it.

With CORRAL_DB_SYNC=full a commit waits for the disk in a thread, so a caller can be cancelled while it
waits; on PostgreSQL every commit does. Before, a CancelJob cut there left the job CANCELLED in the store
but its process running on the worker, its watchers waiting and its record live, and a keyed SubmitJob
left its idempotency key pending for its whole TTL."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from control.admission import Submission
from control.clock import SystemClock
from control.config import ControlConfig
from control.jobs import JobState
from control.scheduler import Scheduler
from control.sessions import Hello, WorkerSessions
from control.store import SQLiteStore
from tests.support.links import RecordingLink
from tests.support.waiting import until


def _scheduler(tmp_path: Path) -> tuple[Scheduler, SQLiteStore]:
    store = SQLiteStore(str(tmp_path / "c.db"), sync="full")
    return Scheduler(store, ControlConfig.from_env({"CORRAL_DB_SYNC": "full"}), SystemClock()), store


async def _cut_while_committing(call: asyncio.Future[Any]) -> None:
    """Cancel ``call`` once it waits for its commit (one loop turn in: the store's writer thread has it)."""
    await asyncio.sleep(0)
    assert not call.done(), "the call ended before it could be cut: no commit to wait for"
    call.cancel()


def test_a_cancel_whose_caller_has_gone_still_stops_the_job_and_tells_its_watchers(tmp_path: Path) -> None:
    async def main() -> None:
        scheduler, store = _scheduler(tmp_path)
        sessions, link = WorkerSessions(scheduler), RecordingLink()
        try:
            # Given a job running on a worker, and a client watching it
            sessions.register(Hello("w1", threads=1, slots=1), link)
            (job,) = await scheduler.intake.submit([Submission("sleep", {"seconds": 60}, payload_json="{}")])
            await until(lambda: [a.job_id for a in link.assigned] == [job.id])
            seen: list[JobState] = []

            async def watch() -> None:
                async for event in scheduler.feeds.watch(job.id):
                    seen.append(event.state)

            watcher = asyncio.ensure_future(watch())
            await until(lambda: seen == [JobState.RUNNING])
            # When its CancelJob is cut while it waits for the commit
            call = asyncio.ensure_future(scheduler.actions.cancel(job.id))
            await _cut_while_committing(call)
            # Then the worker is still told to stop it, the watcher sees it end, and it leaves the live set
            await until(lambda: link.cancelled == [(job.id, 1)])
            await asyncio.wait_for(watcher, 10)
            assert seen == [JobState.RUNNING, JobState.CANCELLED]
            assert job.id not in scheduler.active
            assert (await store.get(job.id)).state is JobState.CANCELLED  # type: ignore[union-attr]
        finally:
            store.close()

    asyncio.run(main())


def test_a_keyed_submission_whose_caller_has_gone_still_settles_its_key(tmp_path: Path) -> None:
    async def main() -> None:
        scheduler, store = _scheduler(tmp_path)
        try:
            call = asyncio.ensure_future(
                scheduler.intake.submit([Submission("noop", {}, payload_json="{}", idempotency_key="order-1")])
            )
            await _cut_while_committing(call)
            await until(lambda: scheduler.state_counts()[JobState.PENDING] == 1)
            await until(lambda: not scheduler.idempotency._pending)  # settled: the cache may trim past it
        finally:
            store.close()

    asyncio.run(main())
