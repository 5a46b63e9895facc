"""The Docker autoscaler against the real Docker engine, with worker containers of the image built
from deploy/ (host networking: they dial the control plane on 127.0.0.1).

Each test labels its containers with its own group (CORRAL_AUTOSCALE_GROUP) and removes only those.
Timings are shortened through the settings (interval 0.25 s, cooldowns and stable periods of 1-3 s).
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from corral.v1 import admin_pb2, jobs_pb2
from tests.conftest import ControlProc, wait_until
from tests.integration.test_autoscaler_recommend import status, status_when, until
from tests.integration.test_health_metrics import scrape
from tests.integration.test_rest import Rest
from tests.support.calls import request, submit_many
from tests.support.certs import make_pki

GROUP_LABEL = "io.corral.group"
WORKER_LABEL = "io.corral.worker-id"

BASE = {
    "AUTOSCALE_MODE": "docker",
    "AUTOSCALE_INTERVAL": "0.25",
    "QUEUE_THRESHOLD_HIGH": "2",
    "QUEUE_THRESHOLD_LOW": "1",
    "MIN_WORKERS": "1",
    "MAX_WORKERS": "4",
    "SCALE_DOWN_STABLE_SEC": "2",
    "CORRAL_SCALE_COOLDOWN_SEC": "1",
    "CORRAL_WORKER_THREADS": "2",
}


class Fleet:
    """One test's control plane(s) and its labelled containers."""

    def __init__(self, docker_client: Any, image: str, make_control_plane: Callable[..., ControlProc]) -> None:
        self.docker = docker_client
        self.image = image
        self.group = f"t{uuid.uuid4().hex[:12]}"
        self._make = make_control_plane
        self.planes: list[ControlProc] = []

    def control_plane(self, **env: Any) -> ControlProc:
        cp = self._make(
            **{**BASE, "WORKER_IMAGE": self.image, "CORRAL_AUTOSCALE_GROUP": self.group, **env},
        )
        self.planes.append(cp)
        return cp

    def containers(self, live: bool = True) -> list[Any]:
        found = self.docker.containers.list(
            all=not live, filters={"label": f"{GROUP_LABEL}={self.group}"}, ignore_removed=True
        )
        return list(found)

    def names(self) -> set[str]:
        return {c.labels[WORKER_LABEL] for c in self.containers()}

    def registered(self, cp: ControlProc) -> set[str]:
        """Workers that run in this group's containers and take work."""
        ours = self.names()
        return {
            w.id
            for w in cp.workers()
            if w.id in ours and w.state in (admin_pb2.Worker.AVAILABLE, admin_pb2.Worker.BUSY)
        }

    def remove_all(self) -> None:
        for cp in self.planes:
            cp.close()  # first, so that nothing starts a replacement
        for c in self.containers(live=False):
            with contextlib.suppress(docker.errors.NotFound):  # one being removed as the plane stopped
                c.remove(force=True)


@pytest.fixture
def fleet(docker_client: Any, worker_image: str, make_control_plane: Callable[..., ControlProc]) -> Iterator[Fleet]:
    f = Fleet(docker_client, worker_image, make_control_plane)
    yield f
    f.remove_all()


def wait_fleet(fleet: Fleet, cp: ControlProc, n: int, timeout: float = 60.0) -> set[str]:
    """Until exactly ``n`` containers run and each one's worker is registered."""

    def settled() -> set[str] | None:
        names = fleet.names()
        return names if len(names) == n and fleet.registered(cp) == names else None

    return until(settled, timeout, interval=0.1, what=f"{n} registered worker containers")


def succeeded(cp: ControlProc, job_id: str) -> jobs_pb2.Job | None:
    job = cp.get(job_id)
    return job if job.state == jobs_pb2.Job.SUCCEEDED else None


def all_done(cp: ControlProc, jobs: list[jobs_pb2.Job]) -> list[jobs_pb2.Job]:
    done = [cp.get(j.id) for j in jobs]
    return done if all(j.state == jobs_pb2.Job.SUCCEEDED for j in done) else []


def actions(cp: ControlProc, since: int = 0) -> list[dict[str, Any]]:
    """scale_up / scale_down events of the log, in order, with ``at`` in seconds."""
    events = [e for name in ("scale_up", "scale_down") for e in cp.events(name)]
    for e in events:
        e["at"] = datetime.strptime(e["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
    return sorted(events, key=lambda e: e["at"])[since:]


def test_backlog_scales_up_step_by_step_then_drains_back_to_min(fleet: Fleet) -> None:
    cp = fleet.control_plane()
    first = wait_fleet(fleet, cp, 1)

    # Given one 2-thread container and 5 slow jobs: 2 run, 3 wait asking 3 threads -> 2 more. (The
    # jobs outlast a slow container start, so the second wave finds the first one still running.)
    wave1 = submit_many(cp, [request("sleep", {"seconds": 20}) for _ in range(5)])
    three = wait_fleet(fleet, cp, 3)
    # When 4 more come with 1 thread free: 3 wait -> 2 wanted, 1 allowed (MAX_WORKERS 4)
    wave2 = submit_many(cp, [request("sleep", {"seconds": 10}) for _ in range(4)])
    four = wait_fleet(fleet, cp, 4)
    assert first < three < four
    ups = [(e["reason"], e["step"], e["desired"]) for e in actions(cp) if e["action"] == "up"]
    assert ups == [("below_min", 1, 1), ("backlog", 2, 3), ("backlog", 1, 4)]

    # Then every job ran in those containers, once
    done = wait_until(lambda: all_done(cp, wave1 + wave2), 90, interval=0.2, what="all jobs to succeed")
    assert {j.worker_id for j in done} == four
    assert [j.attempts for j in done] == [1] * 9

    # And after the queue stayed low for the stable period: drained back to MIN_WORKERS, no job lost
    remaining = wait_fleet(fleet, cp, 1, timeout=60)
    assert remaining < four
    downs = [e for e in actions(cp) if e["action"] == "down"]
    assert downs and downs[0]["reason"] == "idle" and downs[-1]["desired"] == 1
    assert sum(e["step"] for e in downs) == 3
    assert [cp.get(j.id).attempts for j in done] == [1] * 9
    st = until(status_when(Rest(cp.http_port), "currentWorkers", 1), what="the autoscaler to see 1")
    assert (st["mode"], st["currentWorkers"], st["minWorkers"], st["maxWorkers"]) == ("docker", 1, 1, 4)
    assert (st["lastError"], st["scaleUps"], st["scaleDowns"]) == ("", 3, len(downs))
    gone = four - remaining
    assert not gone & {w.id for w in cp.workers()}  # the drained workers left the registry
    assert len(cp.events("worker_container_removed")) >= 3


def test_a_killed_worker_container_is_replaced_and_its_job_reruns(fleet: Fleet) -> None:
    cp = fleet.control_plane(MIN_WORKERS="1", MAX_WORKERS="1", CORRAL_WORKER_THREADS="1")
    (victim,) = wait_fleet(fleet, cp, 1)
    job = submit_many(cp, [request("sleep", {"seconds": 3})])[0]
    wait_until(lambda: cp.get(job.id).state == jobs_pb2.Job.RUNNING, what="the job to run")
    assert cp.get(job.id).worker_id == victim

    # When the container is killed from outside
    (container,) = fleet.containers()
    container.kill()

    # Then a new container replaces it and the job re-runs there
    (replacement,) = wait_fleet(fleet, cp, 1)
    assert replacement != victim
    final = until(lambda: succeeded(cp, job.id), 60, what="the re-run")
    assert final.worker_id == replacement and final.attempts == 2
    (event,) = cp.events("worker_container_replaced")
    assert (event["worker_id"], event["replacement"], event["exit_code"]) == (victim, replacement, 137)
    assert scrape(Rest(cp.http_port))["corral_autoscaler_containers_replaced_total"] == 1
    assert fleet.containers(live=False) == fleet.containers()  # the dead one was removed


def test_square_wave_load_does_not_flap_and_scale_in_never_interrupts_a_job(fleet: Fleet) -> None:
    cooldown = 3.0
    cp = fleet.control_plane(CORRAL_SCALE_COOLDOWN_SEC=str(cooldown), SCALE_DOWN_STABLE_SEC="1.5")
    wait_fleet(fleet, cp, 1)

    # Bursts every 20 s of jobs of mixed lengths (one outlives the burst), three times; the pacing of
    # the load is the only waiting on the clock here
    jobs: list[jobs_pb2.Job] = []
    period, start = 20.0, time.monotonic()
    for burst in range(3):
        due = start + burst * period
        wait_until(partial(_reached, due), period + 1, interval=0.05, what="the next burst")
        jobs += submit_many(cp, [request("sleep", {"seconds": s}) for s in (1, 1, 2, 2, 3, 5)])
    done = wait_until(lambda: all_done(cp, jobs), 90, interval=0.2, what="every burst to finish")

    # Let the lull after the last burst scale in too
    wait_fleet(fleet, cp, 1, timeout=60)
    events = actions(cp)
    times = [e["at"] for e in events]
    assert {e["action"] for e in events} == {"up", "down"}
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(g >= cooldown - 0.05 for g in gaps), gaps  # at most one action per cooldown window
    assert all(j.attempts == 1 and j.state == jobs_pb2.Job.SUCCEEDED for j in done)  # no scale-in cut one short
    assert not cp.events("job_requeued")  # nothing was handed back by a drain either


def test_a_restarted_control_plane_adopts_the_running_containers(fleet: Fleet) -> None:
    cp = fleet.control_plane(MIN_WORKERS="2")
    before = wait_fleet(fleet, cp, 2)
    job = submit_many(cp, [request("sleep", {"seconds": 4})])[0]
    wait_until(lambda: cp.get(job.id).state == jobs_pb2.Job.RUNNING, what="the job to run")

    # When the control plane restarts (same port and database)
    assert cp.stop() == 0
    cp.start()

    # Then after a good number of looks the same two containers serve it, and no third was started
    rest = Rest(cp.http_port)

    def looked() -> bool:
        decisions = scrape(rest)
        return sum(v for k, v in decisions.items() if k.startswith("corral_autoscaler_decisions_total")) >= 12

    wait_until(looked, 30, what="a dozen autoscaler looks")
    assert wait_fleet(fleet, cp, 2) == before
    restart_log = cp.log.read_text().split('"control_started"')[-1]
    assert restart_log.count('"worker_container_adopted"') == 2
    assert '"worker_container_started"' not in restart_log
    final = until(lambda: succeeded(cp, job.id), 30, what="the job")
    assert final.attempts == 1
    assert status(rest)["currentWorkers"] == 2


def test_docker_unreachable_keeps_the_control_plane_serving(
    make_control_plane: Callable[..., ControlProc], spawn_worker: Any, tmp_path: Path
) -> None:
    # A unix socket that nobody listens on
    path = tmp_path / "closed.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()
    cp = make_control_plane(**BASE, DOCKER_HOST=f"unix://{path}", CORRAL_AUTOSCALE_GROUP=f"t{uuid.uuid4().hex[:12]}")
    rest = Rest(cp.http_port)

    st = until(status_when(rest, "lastError"), what="the autoscaler error")
    assert st["mode"] == "docker" and "Docker is unreachable" in st["lastError"] and str(path) in st["lastError"]
    assert scrape(rest)['corral_autoscaler_errors_total{kind="docker_unreachable"}'] >= 1
    assert cp.events("autoscaler_error")[0]["kind"] == "docker_unreachable"

    # The control plane keeps serving: healthy, and jobs run on a worker that is not a container
    assert rest.get("/healthz").status == 200
    spawn_worker(cp)
    job = submit_many(cp, [request("add_numbers", {"a": 2, "b": 3})])[0]
    assert wait_until(lambda: cp.get(job.id).state == jobs_pb2.Job.SUCCEEDED, what="the job")
    assert "Docker is unreachable" in status(rest)["lastError"]  # and it keeps retrying


def test_a_missing_image_is_reported_and_nothing_starts(fleet: Fleet) -> None:
    fleet.image = f"corral-missing-{uuid.uuid4().hex[:8]}:none"
    cp = fleet.control_plane()
    rest = Rest(cp.http_port)
    st = until(status_when(rest, "lastError"), what="the autoscaler error")
    assert f"WORKER_IMAGE {fleet.image!r} is not on the Docker daemon" in st["lastError"]
    assert scrape(rest)['corral_autoscaler_errors_total{kind="image_missing"}'] >= 1
    assert rest.get("/healthz").status == 200
    assert fleet.containers(live=False) == []


def test_against_mutual_tls_the_containers_get_a_certificate_and_dial_the_worker_port(
    fleet: Fleet, tmp_path: Path
) -> None:
    pki = make_pki(tmp_path / "pki")
    cp = fleet.control_plane(
        CORRAL_TLS_CERT=str(pki.server_cert),
        CORRAL_TLS_KEY=str(pki.server_key),
        CORRAL_TLS_CLIENT_CA=str(pki.ca),
        CORRAL_WORKER_PORT="0",
        CORRAL_AUTOSCALE_TLS_CA=str(pki.ca),
        CORRAL_AUTOSCALE_TLS_CERT=str(pki.worker_cert),
        CORRAL_AUTOSCALE_TLS_KEY=str(pki.worker_key),
    )
    cp.tls_ca = pki.ca
    (name,) = wait_fleet(fleet, cp, 1)  # registered: on the worker port, which takes only a verified certificate

    (job,) = submit_many(cp, [request("add_numbers", {"a": 2, "b": 40})])
    done = wait_until(lambda: succeeded(cp, job.id), 60, interval=0.1, what="the job to run in the container")
    assert done is not None and done.worker_id == name and dict(done.result) == {"sum": 42}

    (container,) = fleet.containers()
    env = dict(e.split("=", 1) for e in container.attrs["Config"]["Env"])
    assert env["CORRAL_CONTROL_ADDR"] == f"127.0.0.1:{cp.worker_port}"
    assert (env["CORRAL_TLS_CA"], env["CORRAL_WORKER_TLS_CERT"], env["CORRAL_WORKER_TLS_KEY"]) == (
        "/run/corral-tls/ca.pem",
        "/run/corral-tls/cert.pem",
        "/run/corral-tls/key.pem",
    )
    # The key was copied in as a file: it is in neither the environment nor the labels.
    key = pki.worker_key.read_text().strip().splitlines()[1]
    assert not any(key in v for v in (*env.values(), *container.labels.values()))


def _reached(when: float) -> bool:
    return time.monotonic() >= when
