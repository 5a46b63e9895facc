"""The autoscaler's backlog under execution rate limits, on a real scheduler: a job a gate holds now
waits for a token, not for a worker; once the gate has let it go it is backlog like any other."""

from __future__ import annotations

import asyncio
from pathlib import Path

from control.admission import Submission
from control.autoscale import Action, Autoscaler
from control.clock import SystemClock
from control.config import ControlConfig
from control.jobs import JobState
from control.scheduler import Scheduler
from control.sessions import Hello, WorkerSessions
from control.store import SQLiteStore
from tests.support.links import RecordingLink
from tests.support.waiting import until


def recommending(limits: str) -> ControlConfig:
    return ControlConfig.from_env(
        {
            "AUTOSCALE_MODE": "recommend",
            "CORRAL_EXEC_RATE_LIMITS": limits,
            "QUEUE_THRESHOLD_HIGH": "10",
            "CORRAL_WORKER_THREADS": "2",
        }
    )


class Bundle:
    """A scheduler over SQLite in ``tmp_path`` with the execution limit ``limits`` (one gate), its worker
    sessions, a stand-in worker link and a recommending autoscaler."""

    def __init__(self, tmp_path: Path, limits: str) -> None:
        config = recommending(limits)
        clock = SystemClock()
        self.store = SQLiteStore(str(tmp_path / "c.db"))
        self.scheduler = Scheduler(self.store, config, clock)
        self.sessions, self.link = WorkerSessions(self.scheduler), RecordingLink()
        self.autoscaler = Autoscaler(config, self.scheduler, self.sessions, self.scheduler.metrics, clock)
        assert self.scheduler.exec_limits is not None
        self.limits = self.scheduler.exec_limits
        (self.gate,) = self.limits.gates

    def close(self) -> None:
        self.limits.close()
        self.store.close()


def test_jobs_a_gate_has_released_are_backlog_again(tmp_path: Path) -> None:
    """The autoscaler took out every job a gate had ever parked until it started, so a fast limit that
    had let a whole backlog go still hid it: ready 48 - held 48 = 0, and no scale-up."""

    async def main() -> None:
        b = Bundle(tmp_path, "type:noop=1000/s")
        scheduler, sessions, link, autoscaler, gate = b.scheduler, b.sessions, b.link, b.autoscaler, b.gate
        try:
            # Given one worker with room for 2 jobs, and 50 jobs that pass a 1000/s gate one by one
            sessions.register(Hello("w1", threads=2, slots=2), link)
            await scheduler.intake.submit([Submission("noop", {}, payload_json="{}") for _ in range(50)])
            # When the gate has let every one go: 2 run, 48 wait for a worker, none for a token
            await until(lambda: len(link.assigned) == 2 and gate.waiting == 0, what="the gate to empty")
            await until(lambda: scheduler.counts.get(JobState.PENDING, 0) == 48, what="48 ready jobs")
            # Then the autoscaler sees the 48 as backlog, and asks for the workers they need
            d = await autoscaler.look()
            assert d is not None
            snap = autoscaler.state.snapshot
            assert snap is not None
            assert (snap.ready_jobs, snap.ready_threads) == (48, 48)
            assert (d.action, d.reason, d.desired) == (Action.UP, "backlog", 10)
        finally:
            b.close()

    asyncio.run(main())


def test_jobs_a_gate_holds_now_are_not_backlog(tmp_path: Path) -> None:
    async def main() -> None:
        b = Bundle(tmp_path, "type:noop=1/m")
        scheduler, sessions, link, autoscaler, gate = b.scheduler, b.sessions, b.link, b.autoscaler, b.gate
        try:
            # Given a worker with room to spare, and 20 jobs behind a gate that lets one a minute go
            sessions.register(Hello("w1", threads=2, slots=2), link)
            await scheduler.intake.submit([Submission("noop", {}, payload_json="{}") for _ in range(20)])
            await until(lambda: len(link.assigned) == 1 and gate.waiting == 19, what="19 jobs parked")
            # Then the 19 wait for tokens, which no worker would bring: nothing to scale up for
            d = await autoscaler.look()
            snap = autoscaler.state.snapshot
            assert d is not None and snap is not None
            assert (snap.ready_jobs, d.action) == (0, Action.NONE)
        finally:
            b.close()

    asyncio.run(main())


def test_a_held_job_that_no_new_worker_could_run_either_is_taken_out_once(tmp_path: Path) -> None:
    """Held jobs were subtracted by count after the unfit ones (here, GPU jobs) were: a held GPU job went
    out twice, and real backlog with it (11 jobs read as 2, and no scale-up)."""

    async def main() -> None:
        b = Bundle(tmp_path, "type:add_numbers=1/h")
        scheduler, sessions, link, autoscaler, gate = b.scheduler, b.sessions, b.link, b.autoscaler, b.gate
        try:
            # Given a busy worker, one with two GPUs, and 10 GPU jobs behind a gate that lets one an
            # hour go (one runs, 9 are parked), then 12 jobs that wait for a worker
            sessions.register(Hello("w1", threads=2, slots=2), link)
            await scheduler.intake.submit([Submission("noop", {}, payload_json="{}") for _ in range(2)])
            await until(lambda: len(link.assigned) == 2, what="the worker to be busy")
            sessions.register(Hello("g1", threads=2, slots=2, gpus=2), RecordingLink())
            gpu = Submission("add_numbers", {"a": 1, "b": 2}, payload_json='{"a": 1, "b": 2}', gpu_count=1)
            await scheduler.intake.submit([gpu for _ in range(10)])
            await until(lambda: gate.waiting == 9 and len(scheduler.running) == 3, what="9 GPU jobs parked")
            await scheduler.intake.submit([Submission("noop", {}, payload_json="{}") for _ in range(12)])
            await until(lambda: len(scheduler.running) == 4, what="one of them on the GPU worker's other thread")
            # Then the backlog is the 11 that wait, each taken out once: the GPU jobs, parked, are not
            d = await autoscaler.look()
            snap = autoscaler.state.snapshot
            assert d is not None and snap is not None
            assert (snap.ready_jobs, snap.ready_threads) == (11, 11)
            assert (d.action, d.reason) == (Action.UP, "backlog")
        finally:
            b.close()

    asyncio.run(main())
