"""The images built from deploy/Dockerfile, run on the real Docker engine with host networking.

- The control-plane image serves on the ports it is given, as a non-root user on a read-only root
  file system, and its own HEALTHCHECK turns the container healthy (and reports a dead endpoint).
- A worker container registers with a control plane that the test runs on 127.0.0.1 (authenticated
  with the worker token it got through the environment), runs jobs (the job records name it; a
  compiled kernel runs too), turns healthy, and drains on `docker stop`.
- deploy/docker-compose.yml brings the control plane and its two workers up for real (Prometheus
  and Grafana images cannot be pulled here, so they are left out) and the jobs run on both workers.

Health checks run every 0.5 s here instead of the images' 10 s: the interval is overridden, the
check itself stays the image's.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from corral.v1 import admin_pb2, admin_pb2_grpc, jobs_pb2, jobs_pb2_grpc
from tests.conftest import ControlProc, wait_until
from tests.docker.conftest import ROOT, TEST_LABEL, remove_containers, unavailable
from tests.support.calls import request, result, submit_many, wait_all_done
from tests.support.ports import free_port

FAST_HEALTHCHECK = {"interval": 500_000_000, "timeout": 5_000_000_000, "retries": 3, "start_period": 30_000_000_000}
"""Docker's HealthConfig in nanoseconds, without ``test``: the image's check command is kept."""
WORKER_TOKEN = "docker-test-worker-token-0123456789"


def health(container: Any) -> str:
    """The container's health status (starting, healthy, unhealthy); fails the test if it exited."""
    container.reload()
    state = container.attrs["State"]
    if state["Status"] == "exited":
        logs = container.logs().decode(errors="replace")[-3000:]
        pytest.fail(f"container {container.name} exited with {state['ExitCode']}:\n{logs}")
    status: str = state.get("Health", {}).get("Status", "none")
    return status


def image_healthcheck(client: Any, image: str) -> list[str]:
    test: list[str] = client.images.get(image).attrs["Config"]["Healthcheck"]["Test"]
    return test


def test_the_control_plane_image_serves_and_turns_healthy(
    docker_client: Any, control_image: str, docker_labels: dict[str, str]
) -> None:
    grpc_port, http_port = free_port(), free_port()
    container = docker_client.containers.run(
        control_image,
        detach=True,
        network_mode="host",
        environment={"CORRAL_HOST": "127.0.0.1", "CORRAL_GRPC_PORT": grpc_port, "CORRAL_HTTP_PORT": http_port},
        read_only=True,  # as on Kubernetes (readOnlyRootFilesystem): the store is in the volume
        tmpfs={"/tmp": ""},
        healthcheck=FAST_HEALTHCHECK,
        labels=docker_labels,
    )
    assert container.attrs["Config"]["Healthcheck"]["Test"] == image_healthcheck(docker_client, control_image)
    wait_until(lambda: health(container) == "healthy", 60, 0.2, what="the control-plane container to be healthy")

    # it is the control plane, on the ports it was given, as the user corral (10001)
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthz", timeout=10) as reply:
        assert reply.status == 200
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stats = jobs_pb2_grpc.JobServiceStub(channel).GetStats(jobs_pb2.GetStatsRequest(), timeout=10)
    assert stats.workers == 0 and stats.uptime_seconds > 0
    assert container.exec_run(["id", "-u"]).output.decode().strip() == "10001"
    # the check fails when the endpoint does not answer
    dead = container.exec_run(
        ["python", "/opt/corral/healthcheck.py", "control"], environment={"CORRAL_HTTP_PORT": str(free_port())}
    )
    assert dead.exit_code == 1 and b"/healthz" in dead.output

    container.stop(timeout=30)
    container.reload()
    assert container.attrs["State"]["ExitCode"] == 0, container.logs().decode(errors="replace")[-3000:]


def test_a_worker_container_registers_runs_jobs_and_drains_on_stop(
    docker_client: Any,
    worker_image: str,
    docker_labels: dict[str, str],
    make_control_plane: Callable[..., ControlProc],
) -> None:
    cp = make_control_plane(CORRAL_WORKER_TOKEN=WORKER_TOKEN)
    worker_id = f"docker-{uuid.uuid4().hex[:8]}"
    container = docker_client.containers.run(
        worker_image,
        detach=True,
        network_mode="host",
        environment={
            "CORRAL_CONTROL_ADDR": cp.address,
            "CORRAL_WORKER_TOKEN": WORKER_TOKEN,
            "CORRAL_WORKER_THREADS": "2",
            "CORRAL_WORKER_ID": worker_id,
        },
        read_only=True,
        tmpfs={"/tmp": ""},
        healthcheck=FAST_HEALTHCHECK,
        labels=docker_labels,
    )

    def registered() -> admin_pb2.Worker | None:
        health(container)  # fails the test if the container exited
        return next((w for w in cp.workers() if w.id == worker_id), None)

    worker = wait_until(registered, 60, 0.2, what=f"worker container {worker_id} to register")
    assert worker is not None and worker.threads == 2

    jobs = submit_many(
        cp,
        [
            request("add_numbers", {"a": 40, "b": 2}),
            request("cpu_intensive", {"n": 100_000}, thread_demand=2),
            request("reverse_string", {"text": "corral"}),
        ],
    )
    done = wait_all_done(cp, [j.id for j in jobs], timeout=60)
    assert [j.state for j in done] == [jobs_pb2.Job.SUCCEEDED] * 3, [j.error for j in done]
    assert {j.worker_id for j in done} == {worker_id}
    assert [result(j) for j in (done[0], done[2])] == [{"sum": 42}, {"reversed": "larroc"}]
    assert result(done[1])["primes"] == 9592

    # healthy = connected; the same check fails against a port nobody serves
    wait_until(lambda: health(container) == "healthy", 60, 0.2, what="the worker container to be healthy")
    other = container.exec_run(
        ["python", "/opt/corral/healthcheck.py", "worker"], environment={"CORRAL_CONTROL_ADDR": "127.0.0.1:1"}
    )
    assert other.exit_code == 1 and b"no established connection" in other.output

    # docker stop = SIGTERM = drain: it leaves the control plane and exits 0
    container.stop(timeout=40)
    container.reload()
    assert container.attrs["State"]["ExitCode"] == 0, container.logs().decode(errors="replace")[-3000:]
    assert b"worker_draining" in container.logs()
    wait_until(
        lambda: all(w.id != worker_id or w.state == admin_pb2.Worker.UNAVAILABLE for w in cp.workers()),
        20,
        what="the drained worker to leave",
    )


def test_containers_given_flags_after_the_image_name_turn_healthy(
    docker_client: Any,
    control_image: str,
    worker_image: str,
    docker_labels: dict[str, str],
    make_control_plane: Callable[..., ControlProc],
) -> None:
    # Given a control-plane container whose ports are flags after the image name, not settings, and a
    # worker container given its control plane (after one that is down) the same way
    http_port = free_port()
    control = docker_client.containers.run(
        control_image,
        ["--host", "127.0.0.1", "--grpc-port", str(free_port()), f"--http-port={http_port}"],
        detach=True,
        network_mode="host",
        tmpfs={"/tmp": ""},
        environment={"CORRAL_DB": "/tmp/corral.db"},
        healthcheck=FAST_HEALTHCHECK,
        labels=docker_labels,
    )
    cp = make_control_plane(CORRAL_WORKER_TOKEN=WORKER_TOKEN)
    worker = docker_client.containers.run(
        worker_image,
        ["--control", f"127.0.0.1:{free_port()},{cp.address}", "--threads", "1"],
        detach=True,
        network_mode="host",
        environment={"CORRAL_WORKER_TOKEN": WORKER_TOKEN},
        tmpfs={"/tmp": ""},
        healthcheck=FAST_HEALTHCHECK,
        labels=docker_labels,
    )
    # Then the images' checks go by the flags, as the processes do: both turn healthy (they stayed
    # unhealthy for good, checking the default ports)
    wait_until(lambda: health(control) == "healthy", 60, 0.2, what="the control-plane container to be healthy")
    wait_until(lambda: health(worker) == "healthy", 60, 0.2, what="the worker container to be healthy")
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthz", timeout=10) as reply:
        assert reply.status == 200
    assert any(w.threads == 1 for w in cp.workers())
    for container in (worker, control):
        container.stop(timeout=40)


def test_a_container_stopped_while_it_starts_stops_at_once(
    docker_client: Any, control_image: str, docker_labels: dict[str, str]
) -> None:
    # tini is PID 1: a SIGTERM that comes before Python's handlers exist still ends the process
    # (a bare PID 1 would ignore it, and `docker stop` would wait its whole timeout)
    container = docker_client.containers.run(
        control_image,
        detach=True,
        network_mode="host",
        environment={"CORRAL_HOST": "127.0.0.1", "CORRAL_GRPC_PORT": free_port(), "CORRAL_HTTP_PORT": free_port()},
        labels=docker_labels,
    )
    started = time.monotonic()
    container.stop(timeout=30)
    assert time.monotonic() - started < 10
    container.reload()
    assert container.attrs["State"]["ExitCode"] in (0, 128 + 15)


class ComposeControl:
    """The gRPC stubs of the control plane that compose started (what tests.support.calls takes)."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)

    @property
    def jobs(self) -> jobs_pb2_grpc.JobServiceStub:
        return jobs_pb2_grpc.JobServiceStub(self.channel)

    def workers(self) -> list[admin_pb2.Worker]:
        """The registered workers; none while the control plane does not answer yet."""
        stub = admin_pb2_grpc.AdminServiceStub(self.channel)
        try:
            return list(stub.ListWorkers(admin_pb2.ListWorkersRequest(), timeout=10).workers)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                return []
            raise


@pytest.fixture
def compose_project(docker_client: Any, control_image: str, worker_image: str) -> Iterator[Callable[..., str]]:
    """Runs ``docker-compose`` on deploy/docker-compose.yml as a project of its own, with this test's
    images and free ports; ``down -v`` and the removal of the project's containers at teardown."""
    binary = shutil.which("docker-compose")
    if binary is None:
        unavailable("docker-compose is not installed (Debian: apt-get install docker-compose)")
    project = f"corraltest{uuid.uuid4().hex[:10]}"
    project_env = {
        **os.environ,
        "COMPOSE_PROJECT_NAME": project,
        "CORRAL_CONTROL_IMAGE": control_image,
        "CORRAL_WORKER_IMAGE": worker_image,
        "CORRAL_GRPC_PORT": str(free_port()),
        "CORRAL_HTTP_PORT": str(free_port()),
    }

    def compose(*args: str, timeout: float = 180, env: dict[str, str] | None = None) -> str:
        """Run docker-compose on the project (``args`` may start with more ``-f FILE``); returns its gRPC port."""
        run = subprocess.run(
            [binary, "-f", str(ROOT / "deploy" / "docker-compose.yml"), *args],
            env={**project_env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert run.returncode == 0, f"docker-compose {' '.join(args)} failed:\n{run.stdout}\n{run.stderr}"
        return project_env["CORRAL_GRPC_PORT"]

    try:
        yield compose
    finally:
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            compose("down", "-v", "--timeout", "45", timeout=240)
        remove_containers(docker_client, f"com.docker.compose.project={project}")


def test_compose_runs_the_control_plane_and_two_workers(compose_project: Callable[..., str]) -> None:
    started = time.monotonic()
    grpc_port = compose_project("up", "-d", "--no-build", "control", "worker-1", "worker-2")
    cp = ComposeControl(f"127.0.0.1:{grpc_port}")
    try:
        wait_until(
            lambda: {w.id for w in cp.workers() if w.state != admin_pb2.Worker.UNAVAILABLE} == {"worker-1", "worker-2"},
            90,
            0.2,
            what="both compose workers to register",
        )
        jobs = submit_many(cp, [request("add_numbers", {"a": i, "b": 1}) for i in range(6)])
        done = wait_all_done(cp, [j.id for j in jobs], timeout=60)
        assert [result(j)["sum"] for j in done] == [i + 1 for i in range(6)]
        assert {j.worker_id for j in done} == {"worker-1", "worker-2"}, "round robin over both containers"
    finally:
        cp.channel.close()
    assert time.monotonic() - started < 120


def test_containers_of_a_test_carry_its_label(
    docker_client: Any, worker_image: str, docker_labels: dict[str, str]
) -> None:
    # the teardown helper removes exactly what carries this test's label, nothing else
    container = docker_client.containers.create(worker_image, labels=docker_labels, network_mode="host")
    other = docker_client.containers.create(
        worker_image, labels={TEST_LABEL: f"other-{uuid.uuid4().hex[:8]}"}, network_mode="host"
    )
    try:
        removed = remove_containers(docker_client, f"{TEST_LABEL}={docker_labels[TEST_LABEL]}")
        assert removed == [container.name]
        other.reload()  # still there
    finally:
        other.remove(force=True)


def test_compose_with_the_docker_autoscaler_starts_its_own_workers(
    compose_project: Callable[..., str], docker_client: Any
) -> None:
    from control.autoscale.docker_backend import LABEL_GROUP

    group = f"t{uuid.uuid4().hex[:12]}"
    socket_path = "/var/run/docker.sock"
    if not os.path.exists(socket_path):
        unavailable(f"this test mounts {socket_path} into the control plane, and there is none")
    files = ("-f", str(ROOT / "deploy" / "docker-compose.autoscale.yml"))
    env = {"CORRAL_AUTOSCALE_GROUP": group, "DOCKER_GID": str(os.stat(socket_path).st_gid)}
    try:
        grpc_port = compose_project(*files, "up", "-d", "--no-build", "control", env=env)
        cp = ComposeControl(f"127.0.0.1:{grpc_port}")
        try:
            # MIN_WORKERS=1: the control plane, as user 10001 through the socket's group, starts one
            workers = wait_until(
                lambda: [w.id for w in cp.workers() if w.state != admin_pb2.Worker.UNAVAILABLE],
                90,
                0.2,
                what="the autoscaler's first worker container to register",
            )
            (container,) = docker_client.containers.list(filters={"label": f"{LABEL_GROUP}={group}"})
            (job,) = submit_many(cp, [request("add_numbers", {"a": 1, "b": 1})])
            (done,) = wait_all_done(cp, [job.id], timeout=60)
            assert done.worker_id == workers[0] and result(done) == {"sum": 2}
            assert container.attrs["HostConfig"]["NetworkMode"] == "host"
        finally:
            cp.channel.close()
    finally:
        remove_containers(docker_client, f"{LABEL_GROUP}={group}")
