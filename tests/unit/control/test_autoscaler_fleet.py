"""The docker-mode autoscaler and its fleet on a real scheduler, with Docker replaced by a dict: which
workers a scale-down drains, MAX_WORKERS while drained containers are still finishing their jobs, and
containers that never get a worker or die at start."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from control.admission import Submission
from control.autoscale import Action, Autoscaler, ContainerSpec, Decision, DockerBackend, WorkerContainer
from control.clock import Clock, FakeClock, SystemClock
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
    """This group's containers as a dict; every one started runs at once (or, with ``crash_at_start``,
    has exited with code 1 by the next listing)."""

    def __init__(self, worker_ids: list[str]) -> None:
        super().__init__(ContainerSpec("corral-worker:test", "corral", "127.0.0.1:1", threads=4))
        self.running: dict[str, WorkerContainer] = {}
        self.started: list[str] = []
        self.crash_at_start = False
        for wid in worker_ids:
            self.start(wid)
        self.started.clear()

    def connect(self) -> None: ...
    def close(self) -> None: ...

    def containers(self) -> list[WorkerContainer]:
        return list(self.running.values())

    def start(self, worker_id: str) -> WorkerContainer:
        c = WorkerContainer(f"c-{worker_id}", worker_id, worker_id, "running")
        self.running[worker_id] = WorkerContainer(c.id, worker_id, worker_id, "exited", 1) if self.crash_at_start else c
        self.started.append(worker_id)
        return c

    def put(self, worker_id: str, status: str, exit_code: int = 0) -> None:
        """A container of this group in ``status`` that no worker registered from (yet)."""
        self.running[worker_id] = WorkerContainer(f"c-{worker_id}", worker_id, worker_id, status, exit_code)

    def remove(self, container_id: str, stop_timeout_sec: float = 10.0) -> None:
        self.running = {wid: c for wid, c in self.running.items() if c.id != container_id}


Scenario = Callable[[Scheduler, WorkerSessions, Autoscaler, FakeDocker, dict[str, RecordingLink]], Awaitable[None]]


def run(
    tmp_path: Path,
    busy: int,
    idle: int,
    scenario: Scenario,
    clock: Clock | None = None,
    before: Callable[[FakeDocker], None] = lambda docker: None,
) -> None:
    """``busy`` + ``idle`` registered worker containers of 4 threads; each busy one runs one 1-thread
    job; ``before`` adds to Docker what it will list first; the autoscaler's first look has been taken
    when ``scenario`` starts."""

    async def main() -> None:
        config = ControlConfig.from_env(DOCKER)
        store = SQLiteStore(str(tmp_path / "c.db"))
        scheduler = Scheduler(store, config, clock or SystemClock())
        sessions = WorkerSessions(scheduler)
        wids = [f"busy-{i}" for i in range(busy)] + [f"idle-{i}" for i in range(idle)]
        docker = FakeDocker(wids)
        before(docker)
        links = {wid: RecordingLink() for wid in wids}
        for wid in wids:
            sessions.register(Hello(wid, threads=4, slots=4), links[wid])
        for i in range(busy):
            worker = scheduler.registry.get(f"busy-{i}")
            assert worker is not None
            scheduler.registry.hold(worker, (f"long-{i}", 1), 1)
        autoscaler = Autoscaler(config, scheduler, sessions, scheduler.metrics, scheduler.clock, backend=docker)
        try:
            await autoscaler.start(grpc_port=1)
            await until(lambda: autoscaler.state.last_decision is not None, what="the first look")
            # Its decision is recorded before its containers start (in a thread): wait for them too
            fleet = autoscaler.fleet
            assert fleet is not None
            await until(
                lambda: (
                    all(wid in fleet.containers for wid in docker.started)
                    and len(docker.started) >= _started_by(autoscaler.state.last_decision)
                ),
                what="the first look's containers",
            )
            await scenario(scheduler, sessions, autoscaler, docker, links)
        finally:
            await autoscaler.stop()
            store.close()

    asyncio.run(main())


def _started_by(decision: Decision | None) -> int:
    """Containers a decision starts."""
    return decision.step if decision is not None and decision.action is Action.UP else 0


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


def test_a_container_left_created_is_removed_and_blocks_no_scale_down(tmp_path: Path) -> None:
    """A control plane stopped between Docker's create and start left a container ``created``: the next
    one adopted it as starting, so it counted toward MAX_WORKERS and no scale-down ever happened."""

    async def scenario(
        s: Scheduler, sessions: WorkerSessions, a: Autoscaler, docker: FakeDocker, links: dict[str, RecordingLink]
    ) -> None:
        first = a.state.last_decision
        assert first is not None and (first.action, first.step, first.reason) == (Action.DOWN, 2, "idle")
        assert "stray" not in docker.running and a.state.starting == 0
        assert docker.started == []  # removed, not replaced: it never ran a worker

    run(tmp_path, busy=0, idle=3, scenario=scenario, before=lambda docker: docker.put("stray", "created"))


def test_a_worker_that_never_registers_is_replaced_then_backed_off_and_reported(tmp_path: Path) -> None:
    """A running container whose worker never registered counted as starting for ever (and so blocked
    every scale-down); only GET /v1/autoscaler said so."""
    clock = FakeClock()

    async def scenario(
        s: Scheduler, sessions: WorkerSessions, a: Autoscaler, docker: FakeDocker, links: dict[str, RecordingLink]
    ) -> None:
        first = a.state.last_decision
        assert first is not None and (first.reason, a.state.starting) == ("steady", 1)
        # After the deadline it is removed and replaced, and the error says what to check
        clock.advance(61)
        d = await look(a)
        assert "lost" not in docker.running and len(docker.started) == 1
        assert "worker container lost not registered after 60s, removed" in a.state.last_error
        assert (d.reason, a.state.starting) == ("steady", 1)  # the replacement is starting now
        # The replacement does not register either: a second failure in a row, so no third container for
        # a while, and nothing is starting any more: the idle workers are scaled in
        clock.advance(61)
        d = await look(a)
        assert len(docker.started) == 1 and a.state.starting == 0
        assert "no container is started for 10s" in a.state.last_error
        assert (d.action, d.step, d.reason) == (Action.DOWN, 2, "idle")

    run(tmp_path, busy=0, idle=3, scenario=scenario, clock=clock, before=lambda docker: docker.put("lost", "running"))


def test_containers_that_die_at_start_are_replaced_ever_more_slowly_until_one_stays_up(tmp_path: Path) -> None:
    """An image whose worker exits 1 at start was replaced at every look, for ever, and last_error
    stayed empty."""
    clock = FakeClock()

    async def scenario(
        s: Scheduler, sessions: WorkerSessions, a: Autoscaler, docker: FakeDocker, links: dict[str, RecordingLink]
    ) -> None:
        # The first look started MIN_WORKERS' container; each dies before the next look (every 5 s)
        assert len(docker.started) == 1
        reasons = []
        for _ in range(12):
            clock.advance(5)
            d = await look(a)
            reasons.append(d.reason)
            assert "exited with exit code 1" in a.state.last_error  # at every look, not only at the crash
        # The first crash is replaced at once, then starts wait 10 s, then 20 s (not 12 starts in 60 s)
        assert reasons == [
            "steady",  # replaced at once
            "crash_backoff",
            "crash_backoff",
            "below_min",  # 10 s after the second crash
            "crash_backoff",
            "crash_backoff",
            "crash_backoff",
            "crash_backoff",
            "below_min",  # 20 s after the third
            "crash_backoff",
            "crash_backoff",
            "crash_backoff",
        ]
        assert len(docker.started) == 4
        assert "exited with exit code 1" in a.state.last_error
        assert "no container is started for 40s" in a.state.last_error
        # Once the image is fixed and a container has stayed up with its worker registered, the series ends
        docker.crash_at_start = False
        for _ in range(8):
            clock.advance(5)
            await look(a)
        good = docker.started[-1]
        assert len(docker.started) == 5 and docker.running[good].status == "running"
        sessions.register(Hello(good, threads=4, slots=4), RecordingLink())
        clock.advance(60)
        await look(a)
        assert a.state.last_error == ""
        # So a later crash is replaced at once again
        docker.put(good, "exited", 137)
        clock.advance(5)
        await look(a)
        assert len(docker.started) == 6
        assert a.state.last_error.startswith(f"worker container {good} exited with exit code 137")
        assert a.state.last_error.endswith(f"replaced by {docker.started[-1]}")

    run(
        tmp_path,
        busy=0,
        idle=0,
        scenario=scenario,
        clock=clock,
        before=lambda docker: setattr(docker, "crash_at_start", True),
    )
