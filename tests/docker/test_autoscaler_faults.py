"""Faults against the Docker autoscaler: the real Docker engine, worker containers of the image built from
deploy/ (host networking, they dial the control plane on 127.0.0.1) and a real control plane.

The faults: containers removed behind the autoscaler's back (``docker rm -f``), a daemon frozen
(SIGSTOP of dockerd, a few seconds, always resumed by a timer) while the fleet scales up and down, the
control plane killed (-9) while it starts containers, bursts of 2,000 short jobs then idle (three times),
an image whose containers exit 0 at once, and starts Docker refuses. What must hold: no job lost or run
twice, never more containers than MAX_WORKERS, convergence without help, nothing leaked, errors in the log
and in GET /v1/autoscaler, and the control plane serving throughout.

Each test labels its containers with its own group and removes only those.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import docker
import pytest

from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, wait_until
from tests.docker.conftest import BASE_IMAGE, IMAGE_TEST_TIMEOUT_SEC, unavailable
from tests.docker.test_autoscaler import GROUP_LABEL, Fleet, actions, all_done, wait_fleet
from tests.integration.test_autoscaler_recommend import status, status_when, until
from tests.integration.test_health_metrics import scrape
from tests.integration.test_rest import Rest
from tests.support.calls import request, submit_many

# A test may be the first of the session to need the worker image, whose build can take minutes.
pytestmark = pytest.mark.timeout(IMAGE_TEST_TIMEOUT_SEC)


@pytest.fixture
def fleet(
    docker_client: Any, request: pytest.FixtureRequest, make_control_plane: Callable[..., ControlProc]
) -> Iterator[Fleet]:
    f = Fleet(docker_client, request.getfixturevalue("worker_image"), make_control_plane)
    yield f
    f.remove_all()


def dockerd_pid() -> int:
    """The pid of the local dockerd (the tests that freeze it need it on this machine)."""
    if os.environ.get("DOCKER_HOST", "unix://").split("://")[0] != "unix":
        unavailable("freezing the daemon needs a local dockerd")
    found = subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True, check=False).stdout.split()
    if len(found) != 1:
        unavailable(f"freezing the daemon needs exactly one local dockerd, found {found}")
    return int(found[0])


class Freeze:
    """A dockerd stopped until a timer resumes it (:func:`frozen_dockerd`)."""

    def __init__(self, timer: threading.Timer, seconds: float) -> None:
        self.timer = timer
        self.until = time.monotonic() + seconds

    def thawed(self) -> bool:
        return not self.timer.is_alive()

    def wait_thawed(self, check: Callable[[], object]) -> None:
        """Until the timer resumed dockerd, running ``check`` (which must not call Docker) at every poll."""

        def thawed() -> bool:
            check()
            return self.thawed()

        wait_until(thawed, self.until - time.monotonic() + 10, interval=0.1, what="dockerd to be resumed")


@contextlib.contextmanager
def frozen_dockerd(seconds: float) -> Iterator[Freeze]:
    """SIGSTOP dockerd; a timer SIGCONTs it after ``seconds`` whatever the test does (leaving the block
    early resumes it at once). The block must not call Docker itself."""
    pid = dockerd_pid()
    timer = threading.Timer(seconds, os.kill, (pid, signal.SIGCONT))
    os.kill(pid, signal.SIGSTOP)
    timer.start()
    try:
        yield Freeze(timer, seconds)
    finally:
        timer.cancel()
        os.kill(pid, signal.SIGCONT)


class Peak:
    """Samples the number of this group's live containers in a thread; ``peak`` is the most seen."""

    def __init__(self, group: str) -> None:
        self.client = docker.from_env(timeout=60)
        self.group = group
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            live = self.client.containers.list(filters={"label": f"{GROUP_LABEL}={self.group}"}, ignore_removed=True)
            self.peak = max(self.peak, len(live))
            self._stop.wait(0.1)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(90)
        self.client.close()


def looks(rest: Rest) -> float:
    """How many looks the autoscaler has taken (its decisions, whatever they were)."""
    return sum(v for k, v in scrape(rest).items() if k.startswith("corral_autoscaler_decisions_total"))


def after_looks(rest: Rest, n: int, timeout: float = 30.0, each: Callable[[], None] | None = None) -> None:
    """Until the autoscaler has taken ``n`` more looks; ``each`` runs at every poll meanwhile."""
    target = looks(rest) + n

    def done() -> bool:
        if each is not None:
            each()
        return looks(rest) >= target

    wait_until(done, timeout, interval=0.05, what=f"{n} more autoscaler looks")


def healthy(rest: Rest) -> Callable[[], None]:
    """A check that the control plane answers /healthz."""

    def check() -> None:
        assert rest.get("/healthz").status == 200

    return check


def succeeded_total(cp: ControlProc) -> int:
    reply = cp.jobs.ListJobs(jobs_pb2.ListJobsRequest(status=[jobs_pb2.Job.SUCCEEDED], limit=1), timeout=10)
    return int(reply.total)


def finished(cp: ControlProc, n: int) -> bool:
    return succeeded_total(cp) >= n


def scaled_in(cp: ControlProc, before: int) -> bool:
    """Whether a scale_down was logged since there were ``before``."""
    return len(cp.events("scale_down")) > before


def leftovers(fleet: Fleet) -> list[tuple[str, str]]:
    """This group's containers that are not running (exited, created, dead): none may stay behind."""
    return [(c.name, c.status) for c in fleet.containers(live=False) if c.status != "running"]


# ---- containers removed behind its back ----------------------------------------------------------------


def test_a_container_removed_behind_its_back_is_replaced_at_once_and_its_job_reruns(fleet: Fleet) -> None:
    # A long cooldown: the bounds alone would bring a container back only once it is over.
    cp = fleet.control_plane(
        MIN_WORKERS="1", MAX_WORKERS="2", CORRAL_WORKER_THREADS="1", CORRAL_SCALE_COOLDOWN_SEC="60"
    )
    (victim,) = wait_fleet(fleet, cp, 1)
    (job,) = submit_many(cp, [request("sleep", {"seconds": 2})])
    wait_until(lambda: cp.get(job.id).state == jobs_pb2.Job.RUNNING, 20, what="the job to run")

    # When the container is removed outside the autoscaler, mid-job
    (container,) = fleet.containers()
    container.remove(force=True)

    # Then the next look notices, says so, and starts a replacement (the cooldown is for decisions);
    # the job re-runs there, once more
    (replacement,) = wait_fleet(fleet, cp, 1, timeout=20)
    assert replacement != victim
    (event,) = cp.events("worker_container_replaced")
    assert (event["worker_id"], event["replacement"]) == (victim, replacement)
    # (a listing may catch it killed and not yet removed: then it is the crash it looks like)
    assert event["reason"] in ("vanished", "exited"), event
    (error,) = cp.events("autoscaler_error")
    assert error["kind"] == event["reason"] and victim in error["error"], error
    final = wait_until(lambda: all_done(cp, [job]), 30, interval=0.1, what="the re-run")[0]
    assert (final.worker_id, final.attempts) == (replacement, 2)
    assert [e["reason"] for e in actions(cp)] == ["below_min"]  # no second decision was needed
    assert leftovers(fleet) == []


# ---- the daemon frozen while the fleet scales ------------------------------------------------------------


def test_a_frozen_daemon_while_scaling_up_and_down_blocks_no_dispatch_and_the_fleet_converges(fleet: Fleet) -> None:
    cp = fleet.control_plane(MIN_WORKERS="1", MAX_WORKERS="3", SCALE_DOWN_STABLE_SEC="1")
    rest = Rest(cp.http_port)
    wait_fleet(fleet, cp, 1)

    # Given a backlog the one 2-thread container cannot take: the autoscaler decides to add two
    jobs = submit_many(cp, [request("sleep", {"seconds": 2}) for _ in range(10)])
    wait_until(lambda: len(cp.events("scale_up")) >= 2, 20, interval=0.005, what="the backlog's scale-up")

    # When Docker freezes right then: the starts hang, yet the control plane serves, and dispatches the
    # backlog to the container it has (two waves of two jobs: the second one dispatched while frozen)
    with frozen_dockerd(8) as freeze:
        wait_until(lambda: succeeded_total(cp) >= 4, 7, interval=0.05, what="jobs to run while Docker is frozen")
        assert not freeze.thawed()
        freeze.wait_thawed(healthy(rest))

    # Then, thawed, the fleet reaches its size and every job ran once
    wait_fleet(fleet, cp, 3, timeout=30)
    done = wait_until(lambda: all_done(cp, jobs), 60, interval=0.2, what="every job")
    assert [j.attempts for j in done] == [1] * len(done)

    # When Docker freezes again as the idle fleet scales in (drains, then removes)
    with Peak(fleet.group) as peak:
        wait_until(lambda: cp.events("scale_down"), 30, interval=0.005, what="the scale-down")
        with frozen_dockerd(5) as freeze:
            freeze.wait_thawed(healthy(rest))

        # Then it ends at MIN_WORKERS with nothing left behind, and nothing was taken for a crash
        wait_fleet(fleet, cp, 1, timeout=40)
        wait_until(lambda: not leftovers(fleet), 20, what="no container left behind")
    assert peak.peak <= 3
    assert not cp.events("worker_container_replaced")
    st = until(status_when(rest, "currentWorkers", 1), 20, what="the autoscaler to count 1")
    assert st["lastError"] == ""


# ---- the control plane killed while it starts containers --------------------------------------------------


def test_a_control_plane_killed_while_scaling_up_adopts_its_containers_after_restart(fleet: Fleet) -> None:
    cp = fleet.control_plane(MIN_WORKERS="1", MAX_WORKERS="3", SCALE_DOWN_STABLE_SEC="60")
    (first,) = wait_fleet(fleet, cp, 1)
    jobs = submit_many(cp, [request("sleep", {"seconds": 3}) for _ in range(12)])
    wait_until(lambda: len(cp.events("scale_up")) >= 2, 20, interval=0.005, what="the backlog's scale-up")

    # When the control plane is killed -9 while Docker is still creating its containers (frozen, so that
    # the kill lands between create and start), then restarted on the same port and database
    with Peak(fleet.group) as peak:
        with frozen_dockerd(4) as freeze:
            cp.kill()
            cp.start()
            freeze.wait_thawed(healthy(Rest(cp.http_port)))
        # Then the new process adopts what runs, removes what was never started, and fills up to MAX only
        names = wait_fleet(fleet, cp, 3, timeout=40)
        done = wait_until(lambda: all_done(cp, jobs), 60, interval=0.2, what="every job")
        wait_until(lambda: not leftovers(fleet), 20, what="no container left behind")
    assert first in names
    assert peak.peak <= 3
    restart_log = cp.log.read_text().split('"control_started"')[-1]
    adopted, started = restart_log.count('"worker_container_adopted"'), restart_log.count('"worker_container_started"')
    assert adopted >= 1 and adopted + started == 3, (adopted, started)
    assert [j.attempts for j in done] == [1] * len(done)  # the workers kept their jobs across the restart


# ---- bursts: up then down, three times ---------------------------------------------------------------------


def test_three_bursts_of_2000_jobs_scale_up_and_back_down_and_run_each_job_once(fleet: Fleet) -> None:
    cp = fleet.control_plane(MIN_WORKERS="1", MAX_WORKERS="3", SCALE_DOWN_STABLE_SEC="1", QUEUE_THRESHOLD_HIGH="10")
    rest = Rest(cp.http_port)
    wait_fleet(fleet, cp, 1)
    total = 0
    with Peak(fleet.group) as peak:
        for burst in range(3):
            downs = len(cp.events("scale_down"))
            submit_many(cp, [request("add_numbers", {"a": i, "b": burst}) for i in range(2000)])
            total += 2000
            wait_until(partial(finished, cp, total), 60, interval=0.2, what=f"burst {burst} to finish")
            # the next burst comes as soon as the scale-in has begun (workers draining)
            wait_until(partial(scaled_in, cp, downs), 30, interval=0.05, what="a scale-in")
        wait_fleet(fleet, cp, 1, timeout=40)
    ups = [e for e in actions(cp) if e["action"] == "up"]
    assert len(ups) >= 3 and max(e["desired"] for e in ups) == 3
    assert peak.peak <= 3
    # every job was dispatched once and completed once: none lost, none run twice
    assert len(cp.events("job_dispatched")) == len(cp.events("job_completed")) == total == succeeded_total(cp)
    assert not cp.events("job_retry_scheduled")
    assert status(rest)["lastError"] == ""
    assert leftovers(fleet) == []


# ---- containers that cannot start or do not run the worker ----------------------------------------------------


def test_an_image_whose_containers_exit_0_at_once_is_backed_off_and_reported(fleet: Fleet) -> None:
    # python:3.11-slim runs `python3`, which exits 0 at once without a terminal: no worker ever registers
    fleet.image = BASE_IMAGE
    cp = fleet.control_plane(MIN_WORKERS="1", MAX_WORKERS="2", CORRAL_SCALE_COOLDOWN_SEC="0.5")
    rest = Rest(cp.http_port)

    st = until(status_when(rest, "lastError"), 20, what="the failure to be reported")
    assert "exit code 0 before its worker registered" in st["lastError"]
    until(lambda: "crash_backoff" in status(rest).get("lastDecision", "") or None, 20, what="a hold")

    # Then the starts are held (not one per cooldown for ever), and the error stays where it is seen
    started = len(cp.events("worker_container_started"))
    assert started <= 3
    after_looks(rest, 12)
    assert len(cp.events("worker_container_started")) == started
    assert "exit code 0 before its worker registered" in status(rest)["lastError"]
    assert rest.get("/healthz").status == 200
    wait_until(lambda: not leftovers(fleet), 20, what="the exited containers to be removed")


def test_a_start_docker_refuses_is_backed_off_and_stays_in_last_error(fleet: Fleet) -> None:
    # A network mode naming a container that does not exist: Docker refuses every start
    cp = fleet.control_plane(
        MIN_WORKERS="1",
        MAX_WORKERS="2",
        CORRAL_SCALE_COOLDOWN_SEC="0.5",
        CORRAL_WORKER_NETWORK="container:corral-no-such-container",
        CORRAL_AUTOSCALE_CONTROL_ADDRESS="127.0.0.1:1",
    )
    rest = Rest(cp.http_port)
    st = until(status_when(rest, "lastError"), 20, what="the refusal to be reported")
    assert "No such container" in st["lastError"]
    until(lambda: "crash_backoff" in status(rest).get("lastDecision", "") or None, 20, what="a hold")

    # Then no start is tried while held, and the error never leaves last_error meanwhile
    tries = len(cp.events("scale_up"))
    assert tries <= 3
    cleared: list[str] = []
    after_looks(rest, 12, each=lambda: cleared.extend(["cleared"] if not status(rest)["lastError"] else []))
    assert cleared == []
    assert len(cp.events("scale_up")) == tries
    assert "starting a worker container failed" in status(rest)["lastError"]
    assert not cp.events("autoscaler_recovered")
    assert rest.get("/healthz").status == 200
    assert fleet.containers(live=False) == []  # the refused containers were not left created


def test_an_image_gone_while_the_fleet_runs_is_reported_and_the_restarts_are_backed_off(
    fleet: Fleet, docker_client: Any
) -> None:
    # WORKER_IMAGE is a tag of its own, present at start-up
    tag = f"corral-fault-{fleet.group}:gone"
    docker_client.images.get(fleet.image).tag(tag)
    fleet.image = tag
    try:
        cp = fleet.control_plane(
            MIN_WORKERS="1", MAX_WORKERS="2", CORRAL_WORKER_THREADS="1", CORRAL_SCALE_COOLDOWN_SEC="0.5"
        )
        rest = Rest(cp.http_port)
        wait_fleet(fleet, cp, 1)

        # When the tag goes (the running container keeps its image), then the container is killed
        docker_client.images.remove(tag)
        (container,) = fleet.containers()
        container.kill()

        # Then its replacement cannot start: said so, and no start is tried again while held
        until(lambda: "crash_backoff" in status(rest).get("lastDecision", "") or None, 20, what="a hold")
        assert f"WORKER_IMAGE {tag!r} is not on the Docker daemon" in status(rest)["lastError"]
        tries = len(cp.events("scale_up"))
        after_looks(rest, 12)
        assert len(cp.events("scale_up")) == tries
        assert "is not on the Docker daemon" in status(rest)["lastError"]
        assert rest.get("/healthz").status == 200
        assert fleet.containers(live=False) == []
    finally:
        with contextlib.suppress(docker.errors.ImageNotFound):
            docker_client.images.remove(tag)
