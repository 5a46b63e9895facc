"""Open-file limits (RLIMIT_NOFILE): the soft limit of 1,024 most set-ups give a process, and a worker or
control plane short of descriptors (see corral/open_files.py)."""

from __future__ import annotations

import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from corral.v1 import jobs_pb2, jobs_pb2_grpc
from tests.conftest import FAST_ENV, ROOT, ControlProc, base_env, registered_on, wait_until, with_open_files
from tests.support.calls import result, submit, wait_done
from tests.support.processes import alive, children

S = jobs_pb2.Job
HARD = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
IMPORTS = ("tests.support.jobtypes", "tests.support.hostile_jobtypes")

pytestmark = pytest.mark.skipif(HARD != resource.RLIM_INFINITY and HARD < 2048, reason="needs a hard limit >= 2048")


def _open(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _limits(pid: int) -> tuple[int, int]:
    return resource.prlimit(pid, resource.RLIMIT_NOFILE)


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    yield held
    for sock in held:
        sock.close()


def test_a_worker_runs_more_runner_processes_than_its_soft_limit_holds_and_jobs_keep_that_limit(
    control_plane: ControlProc, spawn_worker: Callable[..., Any]
) -> None:
    # Given a worker started with a soft limit of 150 open files and 60 slots, which take about 200
    # (before: it failed to start its runner processes, "Too many open files")
    worker = spawn_worker(control_plane, threads=60, imports=IMPORTS, open_files=(150, HARD))
    # Then it registered with its 60 slots, having raised its own soft limit
    (seen,) = [w for w in control_plane.workers() if w.id == worker.worker_id]
    assert seen.slots == 60
    assert _limits(worker.proc.pid)[0] > _open(worker.proc.pid) > 150
    # and a job sees the limit the worker was started with, not the raised one
    job = wait_done(control_plane, submit(control_plane, "probe").id)
    assert job.state == S.SUCCEEDED, job.error
    assert result(job)["nofile"] == [150, HARD]


def test_more_slots_than_the_hard_limit_holds_are_refused_before_any_process_starts(
    control_plane: ControlProc, tmp_path: Path
) -> None:
    # Given a worker whose hard limit of 150 open files cannot hold 60 runner processes
    args = [sys.executable, "-m", "worker", "--control", control_plane.address, "--threads", "60"]
    proc = subprocess.run(
        with_open_files(args, (150, 150)), cwd=ROOT, env=base_env(), capture_output=True, text=True, timeout=60
    )
    # Then it exits 2 at once, naming the setting, the limit and what fits
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "CORRAL_WORKER_SLOTS" in line and "RLIMIT_NOFILE" in line and "150" in line and "at most 26 slots" in line
    assert control_plane.workers() == []


@pytest.mark.slow
def test_a_worker_short_of_open_files_waits_to_reconnect_and_keeps_its_job(
    control_plane: ControlProc, spawn_worker: Callable[..., Any]
) -> None:
    # Given a worker running a job, whose open-file limit is then cut below what it holds
    worker = spawn_worker(control_plane, threads=2)
    job = submit(control_plane, "sleep", {"seconds": 8})
    wait_until(lambda: control_plane.get(job.id).state == S.RUNNING, what="the job to run")
    runners = children(worker.proc.pid)
    pid = worker.proc.pid
    raised = _limits(pid)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (_open(pid) - 2, raised[1]))
    # When the control plane is killed and comes back, so that the worker must connect again
    control_plane.kill()
    control_plane.start()
    # Then it does not try while too few descriptors are left but says why and waits (before: its
    # attempt hung in gRPC for good, even once descriptors were there again; at other margins gRPC
    # aborted the worker, SIGABRT, and its running job with it)
    wait_until(lambda: "worker_files_short" in worker.log.read_text(), 20, what="the worker to say it is short")
    assert worker.proc.poll() is None
    assert all(alive(p) for p in runners)
    # and once descriptors are there again it registers, and its job finishes under its first attempt
    resource.prlimit(pid, resource.RLIMIT_NOFILE, raised)
    wait_until(lambda: registered_on(control_plane, worker), 20, what="the worker to register again")
    done = wait_done(control_plane, job.id)
    assert (done.state, done.attempts) == (S.SUCCEEDED, 1)


@pytest.mark.slow
def test_a_control_plane_answers_more_clients_at_once_than_its_soft_limit_holds(
    tmp_path: Path, sockets: list[socket.socket]
) -> None:
    # Given a control plane started with a soft limit of 256 open files (long HTTP deadlines: no
    # connection is closed for being idle while the test runs)
    env = {**FAST_ENV, "CORRAL_HTTP_HEADER_TIMEOUT_SEC": "120"}
    cp = ControlProc(tmp_path, env, open_files=(256, HARD))
    cp.start()
    try:
        # When 600 REST clients connect and each asks for /healthz, keeping its connection
        sockets += [socket.create_connection(("127.0.0.1", cp.http_port)) for _ in range(600)]
        for sock in sockets:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        # Then every one of them is answered (before: about 230 were, the others waited in the listen
        # queue until earlier connections closed, "socket.accept() out of system resource")
        answered = _answers(sockets, within=30.0)
        assert answered == len(sockets)
        # and a gRPC client too, while they stay connected
        with grpc.insecure_channel(cp.address) as channel:
            stats = jobs_pb2_grpc.JobServiceStub(channel).GetStats(jobs_pb2.GetStatsRequest(), timeout=10)
        assert stats.queue_depth == 0
        assert cp.proc is not None and _open(cp.proc.pid) > 600
    finally:
        cp.stop(signal.SIGKILL)
        cp.close()


def _answers(socks: list[socket.socket], within: float) -> int:
    """How many of ``socks`` received the start of an HTTP 200 answer within ``within`` seconds."""
    waiting = {sock.fileno(): sock for sock in socks}
    got = 0
    deadline = time.monotonic() + within
    with selectors.DefaultSelector() as sel:
        for sock in socks:
            sel.register(sock, selectors.EVENT_READ)
        while waiting and (left := deadline - time.monotonic()) > 0:
            for key, _ in sel.select(left):
                sock = waiting.pop(key.fd)
                sel.unregister(sock)
                got += sock.recv(64).startswith(b"HTTP/1.1 200")
    return got


def test_the_http_cap_is_lowered_to_fit_the_open_file_limit_and_grpc_keeps_its_descriptors(
    tmp_path: Path, sockets: list[socket.socket]
) -> None:
    # Given a control plane whose hard open-file limit (1,024) cannot hold the default HTTP cap (1,000)
    # and its workers and gRPC clients besides
    own = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(own[0], 4096), own[1]))  # this test's 1,000 sockets
    env = {**FAST_ENV, "CORRAL_HTTP_HEADER_TIMEOUT_SEC": "120"}
    cp = ControlProc(tmp_path, env, open_files=(1024, 1024))
    cp.start()
    try:
        # Then it says at start that it lowered the cap, and to what
        (lowered,) = cp.events("http_connections_lowered")
        cap = lowered["lowered_to"]
        assert (lowered["configured"], cap) == (1000, 1024 - 320 - 16)
        # When 1,000 REST clients connect and each asks for the stats, keeping its connection
        sockets += [socket.create_connection(("127.0.0.1", cp.http_port)) for _ in range(1000)]
        for sock in sockets:
            sock.sendall(b"GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        # Then the cap's worth are answered, the others refused (503), and gRPC clients and the probes
        # still get through (before: the REST connections took every descriptor, and gRPC calls and
        # /healthz got no answer until they closed)
        assert _answers(sockets, within=30.0) == cap
        with grpc.insecure_channel(cp.address) as channel:
            stats = jobs_pb2_grpc.JobServiceStub(channel).GetStats(jobs_pb2.GetStatsRequest(), timeout=10)
        assert stats.queue_depth == 0
        probe = socket.create_connection(("127.0.0.1", cp.http_port))
        sockets.append(probe)
        probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert _answers([probe], within=10.0) == 1
    finally:
        cp.stop(signal.SIGKILL)
        cp.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, own)
