"""Many jobs falling due at one instant are promoted a chunk per loop turn, never all in one."""

from __future__ import annotations

import asyncio
from pathlib import Path

from control.admission import Submission
from control.clock import FakeClock
from control.config import ControlConfig
from control.jobs import JobState
from control.scheduler import PROMOTE_CHUNK, Scheduler
from control.store import SQLiteStore


def test_jobs_due_together_become_pending_a_chunk_per_loop_turn(tmp_path: Path) -> None:
    async def main() -> None:
        clock = FakeClock()
        store = SQLiteStore(str(tmp_path / "c.db"))
        scheduler = Scheduler(store, ControlConfig.from_env({}), clock)
        try:
            # Given more jobs than a chunk, all scheduled for the same instant (no worker: none runs)
            n = PROMOTE_CHUNK * 2 + 7
            due = clock.now() + 60
            await scheduler.intake.submit(
                [Submission("noop", {}, payload_json="{}", scheduled_at=due) for _ in range(n)]
            )
            assert scheduler.state_counts()[JobState.SCHEDULED] == n
            # When that instant comes, the timer promotes them
            clock.advance(61)
            timer = asyncio.ensure_future(scheduler.run_timer())
            pending: list[int] = []
            for _ in range(50):
                await asyncio.sleep(0)
                pending.append(scheduler.state_counts()[JobState.PENDING])
                if pending[-1] == n:
                    break
            timer.cancel()
            # Then every job is promoted, at most a chunk per loop turn, and the store has them all
            assert pending[-1] == n, pending
            steps = [b - a for a, b in zip([0, *pending], pending, strict=False)]
            assert max(steps) <= PROMOTE_CHUNK, steps
            assert sum(1 for step in steps if step) >= 3
            for _ in range(3):
                await asyncio.sleep(0)  # the last chunk's commit
            assert store.count_by_state()[JobState.PENDING] == n
        finally:
            store.close()

    asyncio.run(main())
