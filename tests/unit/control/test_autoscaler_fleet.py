"""The docker-mode autoscaler and its fleet on a real scheduler, with Docker replaced by a dict: which
workers a scale-down drains, and MAX_WORKERS while drained containers are still finishing their jobs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from control.admission import Submission
from control.autoscale import Action, Autoscaler, ContainerSpec, Decision, DockerBackend, WorkerContainer
from control.clock import SystemClock
from control.config import ControlConfig
from control.scheduler import Scheduler
from control.sessions import Hello, WorkerSessions
from control.store import SQLiteStore
from tests.support.links import RecordingLink
from tests.support.waiting import until

MAX = 10
DOCKER = {
    "AUTOSCALE_MODE": "docker",
    "AUTOSCALE_INTERVAL": "3600",  # the test takes the looks after the first one itself
    "MIN_WORKERS": "1",
    "MAX_WORKERS": str(MAX),
    "QUEUE_THRESHOLD_HIGH": "10",
    "QUEUE_THRESHOLD_LOW": "2",
    "SCALE_DOWN_STABLE_SEC": "0",
    "CORRAL_SCALE_COOLDOWN_SEC": "0",
    "CORRAL_WORKER_THREADS": "4",
}


class FakeDocker(DockerBackend):
    """This group's containers as a dict; every one started runs at once."""

    def __init__(self, worker_ids: list[str]) -> None:
        super().__init__(ContainerSpec("corral-worker:test", "corral", "127.0.0.1:1", threads=4))
        self.running: dict[str, WorkerContainer] = {}
        for wid in worker_ids:
            self.start(wid)

    def connect(self) -> None: ...
    def close(self) -> None: ...

    def containers(self) -> list[WorkerContainer]:
        return list(self.running.values())

    def start(self, worker_id: str) -> WorkerContainer:
        c = WorkerContainer(f"c-{worker_id}", worker_id, worker_id, "running")
        self.running[worker_id] = c
        return c

    def remove(self, container_id: str, stop_timeout_sec: float = 10.0) -> None:
        self.running = {wid: c for wid, c in self.running.items() if c.id != container_id}


Scenario = Callable[[Scheduler, WorkerSessions, Autoscaler, FakeDocker, dict[str, RecordingLink]], Awaitable[None]]


def run(tmp_path: Path, busy: int, idle: int, scenario: Scenario) -> None:
    """``busy`` + ``idle`` registered worker containers of 4 threads; each busy one runs one 1-thread
    job; the autoscaler's first look has been taken when ``scenario`` starts."""

    async def main() -> None:
        config = ControlConfig.from_env(DOCKER)
        clock = SystemClock()
        store = SQLiteStore(str(tmp_path / "c.db"))
        scheduler = Scheduler(store, config, clock)
        sessions = WorkerSessions(scheduler)
        wids = [f"busy-{i}" for i in range(busy)] + [f"idle-{i}" for i in range(idle)]
        docker = FakeDocker(wids)
        links = {wid: RecordingLink() for wid in wids}
        for wid in wids:
            sessions.register(Hello(wid, threads=4, slots=4), links[wid])
        for i in range(busy):
            worker = scheduler.registry.get(f"busy-{i}")
            assert worker is not None
            scheduler.registry.hold(worker, (f"long-{i}", 1), 1)
        autoscaler = Autoscaler(config, scheduler, sessions, scheduler.metrics, clock, backend=docker)
        try:
            await autoscaler.start(grpc_port=1)
            await until(lambda: autoscaler.state.last_decision is not None, what="the first look")
            await scenario(scheduler, sessions, autoscaler, docker, links)
        finally:
            await autoscaler.stop()
            store.close()

    asyncio.run(main())


async def burst(scheduler: Scheduler) -> None:
    """40 jobs that no worker here has the threads for (each asks a whole 4-thread worker)."""
    await scheduler.intake.submit([Submission("noop", {}, payload_json="{}", thread_demand=4) for _ in range(40)])


def drained(scheduler: Scheduler) -> list[str]:
    return sorted(w.id for w in scheduler.registry.all() if w.draining)


async def look(autoscaler: Autoscaler) -> Decision:
    d = await autoscaler.look()
    assert d is not None
    return d


def test_busy_workers_are_not_drained_and_a_burst_stays_within_max(tmp_path: Path) -> None:
    """Spare capacity was counted in free threads: 10 workers each running one long 1-thread job had 30
    free, so 7 busy workers were drained; they left the count while they finished, and a burst then
    added 7 more: 17 containers with MAX_WORKERS 10."""

    async def scenario(
        s: Scheduler, sessions: WorkerSessions, a: Autoscaler, docker: FakeDocker, links: dict[str, RecordingLink]
    ) -> None:
        first = a.state.last_decision
        await burst(s)
        d = await look(a)
        assert (len(docker.running), drained(s)) == (MAX, [])
        assert first is not None and (first.action, first.reason) == (Action.NONE, "steady")
        assert (d.action, d.reason) == (Action.NONE, "at_max")

    run(tmp_path, busy=10, idle=0, scenario=scenario)


def test_draining_containers_count_toward_max_until_they_are_gone(tmp_path: Path) -> None:
    async def scenario(
        s: Scheduler, sessions: WorkerSessions, a: Autoscaler, docker: FakeDocker, links: dict[str, RecordingLink]
    ) -> None:
        # Given 3 busy and 7 idle workers: the 7 idle ones, and only they, are drained
        first = a.state.last_decision
        assert first is not None and (first.action, first.step, first.reason) == (Action.DOWN, 7, "idle")
        idle = [f"idle-{i}" for i in range(7)]
        assert drained(s) == idle
        # When a burst comes while they are still there (a drained worker may take a while to leave)
        await burst(s)
        d = await look(a)
        # Then it adds nothing beside them
        assert (d.action, d.reason) == (Action.NONE, "at_max")
        assert len(docker.running) == MAX
        # And once they have left and their containers are gone, it fills up to MAX again
        for wid in idle:
            sessions.disconnected(wid, links[wid])
        fleet = a.fleet
        assert fleet is not None
        await until(lambda: len(docker.running) == 3 and not fleet.retiring, what="the drained containers to go")
        d = await look(a)
        assert (d.action, d.step, d.reason) == (Action.UP, 7, "backlog")
        assert len(docker.running) == MAX

    run(tmp_path, busy=3, idle=7, scenario=scenario)
