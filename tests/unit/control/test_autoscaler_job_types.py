"""The docker-mode autoscaler's backlog on a real scheduler (Docker replaced by a dict, as in
test_autoscaler_fleet): jobs of a type that the worker containers do not run wait for the workers that
do; more containers would never take them, so they are no reason to start any."""

from __future__ import annotations

import asyncio
from pathlib import Path

from control.admission import Submission
from control.autoscale import Action, Autoscaler
from control.clock import SystemClock
from control.config import ControlConfig
from control.scheduler import Scheduler
from control.sessions import Hello, WorkerSessions
from control.store import JobTypeEntry, SQLiteStore
from tests.support.links import RecordingLink
from tests.support.waiting import until
from tests.unit.control.test_autoscaler_fleet import DOCKER, FakeDocker

ANY_OBJECT = '{"type": "object"}'


def entry(name: str) -> JobTypeEntry:
    return JobTypeEntry(name, ANY_OBJECT, "")


def test_jobs_of_a_type_the_containers_do_not_run_are_not_backlog(tmp_path: Path) -> None:
    async def main() -> None:
        config = ControlConfig.from_env({**DOCKER, "MIN_WORKERS": "1"})
        store = SQLiteStore(str(tmp_path / "c.db"))
        scheduler = Scheduler(store, config, SystemClock())
        sessions = WorkerSessions(scheduler)
        # Given a container whose worker runs noop only, and a worker outside the fleet (a plugin's)
        # that alone runs render; both are busy
        docker = FakeDocker(["box-1"])
        sessions.register(Hello("box-1", threads=4, slots=1, job_types=[entry("noop")]), RecordingLink())
        sessions.register(Hello("plugin-1", threads=1, slots=1, job_types=[entry("render")]), RecordingLink())
        autoscaler = Autoscaler(config, scheduler, sessions, scheduler.metrics, scheduler.clock, backend=docker)
        try:
            await autoscaler.start(grpc_port=1)
            await until(lambda: autoscaler.state.last_decision is not None, what="the first look")
            await scheduler.intake.submit([Submission("noop", {}, payload_json="{}")])
            await scheduler.intake.submit([Submission("render", {}, payload_json="{}") for _ in range(41)])
            await until(lambda: len(scheduler.running) == 2, what="both workers to be busy")

            # When 40 render jobs wait: more noop containers would never take one
            d = await autoscaler.look()
            snap = autoscaler.state.snapshot
            assert d is not None and snap is not None
            assert (snap.ready_jobs, snap.ready_threads) == (0, 0)
            assert (d.action, docker.started) == (Action.NONE, [])

            # Then noop jobs that wait are backlog as before: 12 jobs of one thread, 3 more 4-thread workers
            await scheduler.intake.submit([Submission("noop", {}, payload_json="{}") for _ in range(12)])
            d = await autoscaler.look()
            snap = autoscaler.state.snapshot
            assert d is not None and snap is not None
            assert (snap.ready_jobs, d.action, d.reason, d.step) == (12, Action.UP, "backlog", 3)
        finally:
            await autoscaler.stop()
            store.close()

    asyncio.run(main())
