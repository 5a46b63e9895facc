"""What one worker container offers, and what more containers would not run: its share of the host's
memory (advertised and enforced), jobs asking more memory than that, jobs an owner's running cap holds
back, the group name Docker accepts, and a start Docker refuses (no scale-up counted). On a real
scheduler over SQLite; Docker is replaced by a recording client or by the dict of
test_autoscaler_fleet (the real engine is in tests/docker)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from control.admission import Submission
from control.autoscale import Action, Autoscaler, BackendError, DockerBackend, WorkerContainer
from control.clock import SystemClock
from control.config import ConfigError, ControlConfig
from control.jobs import JobState
from control.scheduler import Scheduler
from control.sessions import Hello, WorkerSessions
from control.store import SQLiteStore
from corral import logs
from corral.resources import detect_memory_mb
from tests.support.links import RecordingLink
from tests.support.waiting import until
from tests.unit.control.test_autoscaler_fleet import DOCKER, FakeDocker

RECOMMEND = {"AUTOSCALE_MODE": "recommend", "QUEUE_THRESHOLD_HIGH": "10", "CORRAL_WORKER_THREADS": "2"}


class Bundle:
    """A scheduler over SQLite in ``tmp_path`` with ``env``, its sessions and an autoscaler."""

    def __init__(self, tmp_path: Path, env: dict[str, str], backend: DockerBackend | None = None) -> None:
        self.config = ControlConfig.from_env(env)
        clock = SystemClock()
        self.store = SQLiteStore(str(tmp_path / "c.db"))
        self.scheduler = Scheduler(self.store, self.config, clock)
        self.sessions = WorkerSessions(self.scheduler)
        self.autoscaler = Autoscaler(
            self.config, self.scheduler, self.sessions, self.scheduler.metrics, clock, backend=backend
        )

    def close(self) -> None:
        self.store.close()


# ---- 1. each container gets its share of the memory, as its setting and as its limit --------------


def test_the_default_container_memory_is_the_hosts_divided_by_max_workers() -> None:
    """Every container advertised the whole host's memory: two of them promised twice what there is."""
    from control.autoscale.autoscaler import container_memory_mb  # new with the fix: a failure, not an error

    config = ControlConfig.from_env({**DOCKER, "MAX_WORKERS": "4"})
    assert container_memory_mb(config) == max(1, detect_memory_mb() // 4)
    set_ = ControlConfig.from_env({**DOCKER, "CORRAL_AUTOSCALE_WORKER_MEMORY_MB": "1536"})
    assert container_memory_mb(set_) == 1536


@pytest.mark.parametrize("raw", ["0", "-5", str((1 << 30) + 1)])
def test_a_bad_container_memory_is_refused_naming_the_variable_and_the_rule(raw: str) -> None:
    with pytest.raises(ConfigError, match=r"CORRAL_AUTOSCALE_WORKER_MEMORY_MB must be 1\.\.1073741824"):
        ControlConfig.from_env({**DOCKER, "CORRAL_AUTOSCALE_WORKER_MEMORY_MB": raw})


class RecordingClient:
    """Enough of a docker client for DockerBackend.start: records what ``containers.create`` was given."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.containers = self

    def ping(self) -> None: ...

    def create(self, image: str, **kwargs: Any) -> Any:
        self.created.append(kwargs)

        class Container:
            id, name, status, attrs = "c" * 64, kwargs["name"], "running", {"Config": {"Labels": kwargs["labels"]}}

            def start(self) -> None: ...
            def reload(self) -> None: ...
            def remove(self, force: bool) -> None: ...

        return Container()


def test_each_container_is_told_its_memory_and_limited_to_it(tmp_path: Path) -> None:
    async def main() -> None:
        b = Bundle(tmp_path, {**DOCKER, "MAX_WORKERS": "4", "CORRAL_AUTOSCALE_WORKER_MEMORY_MB": "3000"})
        try:
            # The autoscaler's own spec carries the figure ...
            await b.autoscaler.start(grpc_port=1)
            await b.autoscaler.stop()
            assert b.autoscaler.backend is not None
            assert b.autoscaler.backend.spec.memory_mb == 3000
            # ... and a container started from it is told it and held to it
            client = RecordingClient()
            DockerBackend(b.autoscaler.backend.spec, client_factory=lambda: client).start("corral-worker-1")
            (created,) = client.created
            assert created["environment"]["CORRAL_WORKER_MEMORY_MB"] == "3000"
            assert created["mem_limit"] == 3000 << 20
        finally:
            b.close()

    asyncio.run(main())


# ---- 2. jobs asking more memory than a container offers are not backlog --------------------------


def test_jobs_asking_more_memory_than_a_container_offers_are_not_backlog(tmp_path: Path) -> None:
    """12 jobs with memory_mb=200000 on a host of 24 GB scaled the fleet to MAX_WORKERS, for good."""

    async def main() -> None:
        b = Bundle(tmp_path, {**RECOMMEND, "CORRAL_AUTOSCALE_WORKER_MEMORY_MB": "1024"})
        try:
            b.sessions.register(Hello("w1", threads=2, slots=2, memory_mb=1024), RecordingLink())
            big = Submission("noop", {}, payload_json="{}", memory_mb=200_000)
            await b.scheduler.intake.submit([big for _ in range(12)])
            d = await b.autoscaler.look()
            snap = b.autoscaler.state.snapshot
            assert d is not None and snap is not None
            assert (snap.ready_jobs, d.action) == (0, Action.NONE)
            # Jobs that fit one (1024 MiB) still are
            fits = Submission("noop", {}, payload_json="{}", memory_mb=1024, thread_demand=2)
            await b.scheduler.intake.submit([fits for _ in range(12)])
            await until(lambda: b.scheduler.counts.get(JobState.PENDING, 0) == 23, what="one to run, 23 ready")
            d = await b.autoscaler.look()
            snap = b.autoscaler.state.snapshot
            assert d is not None and snap is not None
            assert snap.ready_jobs == 11
            assert (d.action, d.reason) == (Action.UP, "backlog")
        finally:
            b.close()

    asyncio.run(main())


# ---- 3. jobs an owner's running cap holds back are not backlog -----------------------------------


@pytest.mark.parametrize(("cap", "backlog"), [(2, 0), (5, 3)])
def test_jobs_an_owners_running_cap_holds_back_are_not_backlog(tmp_path: Path, cap: int, backlog: int) -> None:
    """With CORRAL_OWNER_MAX_RUNNING=2 and 20 jobs the fleet went 1 -> 3 and sat there, 2 idle: the jobs
    waited for the owner's own jobs to end, not for workers. Of a capped owner's ready jobs only
    cap - running are backlog."""

    async def main() -> None:
        env = {
            **RECOMMEND,
            "CORRAL_OWNER_MAX_RUNNING": str(cap),
            "QUEUE_THRESHOLD_HIGH": "2",
            "QUEUE_THRESHOLD_LOW": "1",
        }
        b = Bundle(tmp_path, env)
        link = RecordingLink()
        try:
            b.sessions.register(Hello("w1", threads=2, slots=2), link)
            await b.scheduler.intake.submit([Submission("noop", {}, payload_json="{}") for _ in range(20)], owner="ann")
            await until(lambda: len(link.assigned) == 2, what="2 of ann's jobs to run")
            d = await b.autoscaler.look()
            snap = b.autoscaler.state.snapshot
            assert d is not None and snap is not None
            assert snap.ready_jobs == backlog
            assert d.action is (Action.NONE if backlog <= 2 else Action.UP)
        finally:
            b.close()

    asyncio.run(main())


# ---- 4. a group name Docker refuses as a container name's start ---------------------------------


@pytest.mark.parametrize("group", ["_x", "-x", ".x", "a" * 65, "a b"])
def test_a_group_docker_would_refuse_as_a_container_name_is_refused(group: str) -> None:
    with pytest.raises(ConfigError, match=r"CORRAL_AUTOSCALE_GROUP must match \[A-Za-z0-9\]\[A-Za-z0-9_\.-\]\{0,63\}"):
        ControlConfig.from_env({"CORRAL_AUTOSCALE_GROUP": group})


@pytest.mark.parametrize("group", ["x", "0x_.-", "a" * 64])
def test_a_group_docker_accepts_passes(group: str) -> None:
    assert ControlConfig.from_env({"CORRAL_AUTOSCALE_GROUP": group}).autoscale_group == group


# ---- 5. a start Docker refuses is no scale-up --------------------------------------------------


class RefusingDocker(FakeDocker):
    """Refuses every start after the first ``allow`` (as for a bad network)."""

    def __init__(self, allow: int = 0) -> None:
        super().__init__([])
        self.allow = allow

    def start(self, worker_id: str) -> WorkerContainer:
        if self.allow <= 0:
            raise BackendError("docker_api", "the Docker API refused: No such container: nope")
        self.allow -= 1
        return super().start(worker_id)


@pytest.mark.parametrize(("allow", "ups"), [(0, 0), (1, 1)])
def test_a_start_docker_refuses_is_no_scale_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, allow: int, ups: int
) -> None:
    """scale_up was logged and counted, and a cooldown began, before Docker was asked: a refused start
    read as a scale-up."""

    async def main() -> None:
        docker = RefusingDocker(allow)
        b = Bundle(tmp_path, {**DOCKER, "MIN_WORKERS": "2", "CORRAL_SCALE_COOLDOWN_SEC": "600"}, backend=docker)
        try:
            await b.autoscaler.start(grpc_port=1)
            await until(lambda: b.autoscaler.state.last_error != "", what="the refusal to be reported")
            st = b.autoscaler.status()
            assert st.scale_ups == ups
            assert len(docker.started) == ups
            assert (st.cooldown_remaining > 0) is (ups > 0)
            assert f"{2 - ups} of 2 worker container starts failed" in st.last_error
            ups_logged = [r for r in caplog.records if r.getMessage() == logs.SCALE_UP]
            assert [getattr(r, "step", None) for r in ups_logged] == ([1] if ups else [])
            refused = [r for r in caplog.records if r.getMessage() == logs.AUTOSCALER_ERROR]
            assert any("worker container starts failed" in getattr(r, "error", "") for r in refused)
        finally:
            await b.autoscaler.stop()
            b.close()

    with caplog.at_level(logging.INFO):
        asyncio.run(main())
