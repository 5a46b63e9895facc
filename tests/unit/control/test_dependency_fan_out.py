"""A job that many others wait for: when it ends, they move a chunk per event-loop turn, so the loop is
never held for all of them; those not reached yet when the job is retried wait for it again.

On a real Scheduler and SQLite store; the worker is a stand-in link."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from control.admission import Submission
from control.clock import FakeClock
from control.config import ControlConfig
from control.dependencies import ENDED_CHUNK
from control.jobs import JobState
from control.scheduler import Scheduler
from control.sessions import Hello, Outcome, Report, WorkerSessions
from control.store import SQLiteStore
from corral.errors import FailedPrecondition
from tests.support.links import RecordingLink
from tests.support.waiting import until

WIDE = 2 * ENDED_CHUNK + 100


async def _fan_out(scheduler: Scheduler, root_id: str, wide: int = WIDE) -> list[str]:
    subs = [Submission("noop", {}, payload_json="{}", depends_on=(root_id,)) for _ in range(wide)]
    return [job.id for job in await scheduler.intake.submit(subs, batch=True)]


def _states(scheduler: Scheduler, ids: list[str]) -> dict[JobState, int]:
    counts: dict[JobState, int] = {}
    for job_id in ids:
        job = scheduler.active.get(job_id) or scheduler.recent.get(job_id)
        assert job is not None
        counts[job.state] = counts.get(job.state, 0) + 1
    return counts


def test_the_jobs_waiting_for_a_cancelled_one_are_cancelled_a_chunk_per_turn(tmp_path: Path) -> None:
    async def main() -> None:
        clock = FakeClock()
        store = SQLiteStore(str(tmp_path / "c.db"))
        scheduler = Scheduler(store, ControlConfig.from_env({}), clock)
        try:
            (root,) = await scheduler.intake.submit(
                [Submission("noop", {}, payload_json="{}", scheduled_at=clock.now() + 60)]
            )
            ids = await _fan_out(scheduler, root.id)
            # When the job they wait for is cancelled, one chunk of them is cancelled in that turn
            await scheduler.actions.cancel(root.id)
            assert _states(scheduler, ids) == {JobState.CANCELLED: ENDED_CHUNK, JobState.SCHEDULED: WIDE - ENDED_CHUNK}
            # then at most a chunk in each turn after, until none waits
            cancelled = [ENDED_CHUNK]
            while cancelled[-1] < WIDE and len(cancelled) < 100:
                await asyncio.sleep(0)
                cancelled.append(_states(scheduler, ids).get(JobState.CANCELLED, 0))
            assert cancelled[-1] == WIDE and max(b - a for a, b in itertools.pairwise(cancelled)) <= ENDED_CHUNK
            assert not scheduler.dependencies.waiters
        finally:
            store.close()

    asyncio.run(main())


def test_those_not_reached_when_the_job_is_retried_wait_for_it_again(tmp_path: Path) -> None:
    async def main() -> None:
        store = SQLiteStore(str(tmp_path / "c.db"))
        config = ControlConfig.from_env({"CORRAL_DEFAULT_MAX_ATTEMPTS": "1"})
        scheduler = Scheduler(store, config, FakeClock())
        sessions, link = WorkerSessions(scheduler), RecordingLink()
        try:
            # Given a job running on a worker, which WIDE others wait for
            sessions.register(Hello("w1", threads=1, slots=1), link)
            (root,) = await scheduler.intake.submit([Submission("noop", {}, payload_json="{}")])
            await until(lambda: bool(link.assigned), 5, "the root to be leased")
            wide = 20 * ENDED_CHUNK
            ids = await _fan_out(scheduler, root.id, wide)
            # When it fails for good, and is retried (as soon as the failure is stored) before the
            # cancellation it set off has reached all of those waiting
            (a,) = link.assigned
            sessions.results("w1", [Report(root.id, a.attempt, Outcome.FAILED, "", "ERROR", "boom")], link)
            await until(lambda: root.id not in scheduler.active, 5, "the failure to be stored")
            assert _states(scheduler, ids).get(JobState.SCHEDULED, 0) > 0  # some not reached yet
            retried = await scheduler.actions.retry(root.id)
            assert retried.state is not JobState.FAILED
            # Then every one of them waits for it again: none stays cancelled
            assert _states(scheduler, ids) == {JobState.SCHEDULED: wide}
            assert sorted(scheduler.dependencies.waiters[root.id]) == sorted(ids)
            assert all(scheduler.active[i].waiting_on == frozenset({root.id}) for i in ids)
            assert set(store.states(ids).values()) == {JobState.SCHEDULED}
        finally:
            store.close()

    asyncio.run(main())


def test_a_replayed_key_answers_its_job_after_a_dependency_failed(tmp_path: Path) -> None:
    """The dependencies were checked before the key was looked up, so a client sending again a request
    whose answer it lost was refused (the job it depends on had FAILED since) instead of getting its job."""

    async def main() -> None:
        store = SQLiteStore(str(tmp_path / "c.db"))
        config = ControlConfig.from_env({"CORRAL_DEFAULT_MAX_ATTEMPTS": "1"})
        scheduler = Scheduler(store, config, FakeClock())
        sessions, link = WorkerSessions(scheduler), RecordingLink()
        try:
            # Given a job that waits for another, submitted with a key
            sessions.register(Hello("w1", threads=1, slots=1), link)
            (root,) = await scheduler.intake.submit([Submission("noop", {}, payload_json="{}")])
            await until(lambda: bool(link.assigned), 5, "the root to be leased")
            keyed = Submission("noop", {}, payload_json="{}", depends_on=(root.id,), idempotency_key="step-2")
            (waiting,) = await scheduler.intake.submit([keyed])
            # When the job it waits for fails for good, which cancels it
            (a,) = link.assigned
            sessions.results("w1", [Report(root.id, a.attempt, Outcome.FAILED, "", "ERROR", "boom")], link)
            await until(lambda: waiting.state is JobState.CANCELLED, 5, "the waiting job to be cancelled")
            # Then the same request with the same key answers that job, alone or in a batch
            (again,) = await scheduler.intake.submit([keyed])
            assert (again.id, again.state) == (waiting.id, JobState.CANCELLED)
            batch = await scheduler.intake.submit([keyed, Submission("noop", {}, payload_json="{}")], batch=True)
            assert batch[0].id == waiting.id
            # And a new job that depends on the failed one is still refused
            with pytest.raises(FailedPrecondition, match="could never start"):
                await scheduler.intake.submit([Submission("noop", {}, payload_json="{}", depends_on=(root.id,))])
        finally:
            store.close()

    asyncio.run(main())
