"""What a restart works out again from the store: the waits of jobs whose dependencies ended while
the control plane was down, or before it could move all of those waiting for them.

On a real Scheduler and SQLite store; "a crash" is the store closed with the later moves of a fan-out
not yet run (they are made a chunk per loop turn, control.dependencies)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from control.admission import Submission
from control.clock import FakeClock
from control.config import ControlConfig
from control.dependencies import ENDED_CHUNK
from control.jobs import DEPENDENCY_FAILED, JobState
from control.scheduler import Scheduler
from control.store import SQLiteStore


def test_a_chain_below_a_job_cancelled_at_recovery_is_cancelled_too(tmp_path: Path) -> None:
    """A job whose dependency was cancelled by the recovery itself (its own dependency had failed, and
    the crash came before the cancel reached it) was put in the delayed queue and ran: the recovery
    looked only at the stored states of dependencies that were not live, and at live ones not ended."""
    db = str(tmp_path / "c.db")
    wide = ENDED_CHUNK + 20

    async def before_the_crash() -> tuple[list[str], list[str]]:
        clock = FakeClock()
        store = SQLiteStore(db)
        scheduler = Scheduler(store, ControlConfig.from_env({}), clock)
        try:
            # Given a root that more than a chunk of jobs wait for, and a job that waits for each of them
            (root,) = await scheduler.intake.submit(
                [Submission("noop", {}, payload_json="{}", scheduled_at=clock.now() + 60)]
            )
            middle = await scheduler.intake.submit(
                [Submission("noop", {}, payload_json="{}", depends_on=(root.id,)) for _ in range(wide)], batch=True
            )
            leaves = await scheduler.intake.submit(
                [Submission("noop", {}, payload_json="{}", depends_on=(m.id,)) for m in middle], batch=True
            )
            # When the root is cancelled, and the control plane stops before the cancel reached them all
            await scheduler.actions.cancel(root.id)
            return [m.id for m in middle], [leaf.id for leaf in leaves]
        finally:
            store.close()  # no loop turn since the cancel: the next chunks were never made

    middle, leaves = asyncio.run(before_the_crash())

    async def after_the_restart() -> None:
        store = SQLiteStore(db)
        scheduler = Scheduler(store, ControlConfig.from_env({}), FakeClock())
        try:
            stored = store.states(middle)
            assert sum(state is JobState.SCHEDULED for state in stored.values()) == wide - ENDED_CHUNK
            scheduler.recover()
            await scheduler.commit()
            # Then every job of the chain is cancelled for its failed dependency: none is queued to run
            for job_id in middle + leaves:
                job = await scheduler.get(job_id)
                assert job.state is JobState.CANCELLED, (job_id in leaves, job.state)
                assert job.error_code == DEPENDENCY_FAILED
            assert len(scheduler.delayed) == 0
            assert set(store.states(leaves).values()) == {JobState.CANCELLED}
            counts = scheduler.state_counts()
            assert counts[JobState.SCHEDULED] == 0 and counts[JobState.PENDING] == 0
        finally:
            store.close()

    asyncio.run(after_the_restart())
