"""The reaper, a step of the system time and a pause of the control plane: silence is judged on the
monotonic clock, less the time the control plane stood still; running leases move with the step.

The system time cannot be stepped in a test on a shared machine, so the clock here is a FakeClock whose
wall time jumps (``step``) while its monotonic time does not, as a real one does when an operator or an NTP
step moves the time. Everything else is real: the scheduler, the sessions, the SQLite store.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from control.admission import Submission
from control.clock import FakeClock
from control.config import ControlConfig
from control.jobs import JobState
from control.reaper import Reaper
from control.registry import Assignment, AttemptKey
from control.scheduler import Scheduler
from control.sessions import Hello, WorkerSessions
from control.store import SQLiteStore
from tests.support.waiting import until


class Link:
    def __init__(self) -> None:
        self.closed = False
        self.assigned: list[str] = []
        self.cancelled: list[str] = []

    def assign(self, assignments: list[Assignment]) -> None:
        self.assigned += [a.job_id for a in assignments]

    def cancel(self, job_id: str, attempt: int) -> None:
        self.cancelled.append(job_id)

    def ack(self, attempts: list[AttemptKey]) -> None: ...

    def drain(self, deadline_sec: float) -> None: ...

    def close(self) -> None:
        self.closed = True


@dataclass
class Parts:
    """A real scheduler, sessions and SQLite store on a FakeClock, a reaper, and worker "w1" registered."""

    clock: FakeClock
    store: SQLiteStore
    scheduler: Scheduler
    sessions: WorkerSessions
    reaper: Reaper
    link: Link


def _parts(tmp_path: Path, env: dict[str, str]) -> Parts:
    clock = FakeClock()
    store = SQLiteStore(str(tmp_path / "c.db"))
    scheduler = Scheduler(store, ControlConfig.from_env(env), clock)
    sessions = WorkerSessions(scheduler)
    link = Link()
    sessions.register(Hello("w1", threads=1, slots=1), link)
    return Parts(clock, store, scheduler, sessions, Reaper(scheduler), link)


def test_a_step_of_the_system_time_reaps_no_live_worker(tmp_path: Path) -> None:
    async def main() -> None:
        p = _parts(tmp_path, {"WORKER_HEARTBEAT_TIMEOUT_SEC": "10"})
        clock, scheduler, reaper, link = p.clock, p.scheduler, p.reaper, p.link
        try:
            # When the system time steps an hour ahead, a second after the worker was heard from
            clock.advance(1)
            clock.step(3600)
            reaper.sweep()
            # Then it is still there (before: silent for 3601 s by the wall clock, it was reaped,
            # and every job it ran failed WORKER_LOST while still running)
            assert "w1" in scheduler.registry and not link.closed and reaper.reaped == 0
            # and real silence still reaps it: 10 s of the monotonic clock, whatever the wall says
            clock.step(-7200)
            clock.advance(10.5)
            reaper.sweep()
            assert "w1" not in scheduler.registry and link.closed and reaper.reaped == 1
        finally:
            p.store.close()

    asyncio.run(main())


def test_a_step_of_the_system_time_moves_running_leases_with_it(tmp_path: Path) -> None:
    async def main() -> None:
        p = _parts(tmp_path, {"CORRAL_LEASE_GRACE_SEC": "5"})
        clock, scheduler, sessions, reaper, link = p.clock, p.scheduler, p.sessions, p.reaper, p.link
        try:
            # Given a job running with a 60 s timeout (its lease ends 65 s after it started)
            (job,) = await scheduler.intake.submit([Submission("noop", {}, payload_json="{}", timeout_sec=60)])
            for _ in range(100):  # loop turns, not time: the dispatch runs on the next ones
                if link.assigned:
                    break
                await asyncio.sleep(0)
            assert job.state is JobState.RUNNING and link.assigned == [job.id]
            reaper.sweep()
            # When the system time steps two minutes ahead, 1 s later
            clock.advance(1)
            sessions.heard_from("w1")
            clock.step(120)
            reaper.sweep()
            # Then the lease still runs (before: it had "expired", and the job failed LEASE_EXPIRED
            # and was cancelled on its worker)
            assert job.state is JobState.RUNNING and link.cancelled == []
            # and it still ends at its own timeout plus grace, by the monotonic clock
            clock.advance(63.5)
            sessions.heard_from("w1")
            reaper.sweep()
            assert job.state is JobState.RUNNING
            clock.advance(1)
            sessions.heard_from("w1")
            reaper.sweep()
            assert job.state is not JobState.RUNNING
            # and its worker is told to stop it once the failure is committed, not before
            assert link.cancelled == []
            await until(lambda: link.cancelled == [job.id])
        finally:
            p.store.close()

    asyncio.run(main())


def test_time_the_control_plane_stood_still_is_no_worker_silence_but_real_silence_after_it_is(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        p = _parts(tmp_path, {"WORKER_HEARTBEAT_TIMEOUT_SEC": "10"})
        clock, scheduler, reaper = p.clock, p.scheduler, p.reaper
        try:
            # When the control plane stood still for a minute, 2 s after the worker was last heard
            clock.advance(2)
            clock.advance(60)
            reaper.forgive(60)
            reaper.sweep()
            # Then the worker is not lost: 2 s of silence count, not 62
            assert "w1" in scheduler.registry and reaper.reaped == 0
            # and silence after the pause still does: 8 s more make the 10 s timeout
            clock.advance(7.5)
            reaper.sweep()
            assert "w1" in scheduler.registry
            clock.advance(1)
            reaper.sweep()
            assert "w1" not in scheduler.registry and reaper.reaped == 1
        finally:
            p.store.close()

    asyncio.run(main())
