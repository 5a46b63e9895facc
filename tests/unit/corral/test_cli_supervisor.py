"""The supervisor behind `corral up` / `corral demo`, with small fake control and worker programs.

The fakes are real processes: ``fakecontrol`` serves the gRPC health service on 127.0.0.1 and writes its
port file; ``fakeworker`` waits for SIGTERM. Both append what happens to them to one events file (one
O_APPEND write per line), so a test can read the order in which they were stopped. Marker files steer them:
``crash-once`` makes the next worker exit 1 at once (and is consumed), ``die`` makes the control plane exit 4.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

import corral.resources
from corral.cli.supervisor import ClusterConfig, ControlPlaneExited, Supervisor, SupervisorError, WorkerRefusedSettings
from tests.support.processes import alive

T = TypeVar("T")

FAKE_CONTROL = """
import argparse, os, signal, sys, threading, time
from concurrent import futures
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

def note(text):
    os.write(EVENTS, f"{text}\\n".encode())

p = argparse.ArgumentParser()
for flag in ("--host", "--grpc-port", "--http-port", "--db", "--port-file"):
    p.add_argument(flag)
a = p.parse_args()
EVENTS = os.open(os.environ["FAKE_EVENTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
if os.environ.get("FAKE_CONTROL_FAIL"):
    print("fake control: cannot open the database", file=sys.stderr)
    sys.exit(2)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
port = server.add_insecure_port(f"{a.host}:{a.grpc_port}")
server.start()
with open(a.port_file + ".tmp", "w") as f:
    f.write(str(port))
os.replace(a.port_file + ".tmp", a.port_file)
note(f"control-started {os.getpid()} http={a.http_port}")
die = os.path.join(os.environ["FAKE_DIR"], "die")
while not stop.wait(0.02):
    if os.path.exists(die):
        sys.exit(4)
note("control-term")
server.stop(None)
"""

FAKE_WORKER = """
import os, signal, sys, threading
EVENTS = os.open(os.environ["FAKE_EVENTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
crash = os.path.join(os.environ["FAKE_DIR"], "crash-once")
if os.environ.get("FAKE_WORKER_BAD_SETTING"):
    print("python -m worker: CORRAL_WORKER_LABELS must be k=v pairs, got 'bad'", file=sys.stderr)
    sys.exit(2)
try:
    os.unlink(crash)
    sys.exit(1)
except FileNotFoundError:
    pass
if os.environ.get("FAKE_WORKER_IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.write(EVENTS, f"worker-started {os.getpid()} {' '.join(sys.argv[1:])}\\n".encode())
    threading.Event().wait()
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
os.write(EVENTS, f"worker-started {os.getpid()} {' '.join(sys.argv[1:])}\\n".encode())
stop.wait()
os.write(EVENTS, f"worker-term {os.getpid()}\\n".encode())
"""

SUPERVISOR = """
import sys, threading
from pathlib import Path
from corral.cli.supervisor import ClusterConfig, Supervisor
root = Path(sys.argv[1])
config = ClusterConfig(grpc_port=0, http_port=0, db=str(root / "db"), workers=2, threads=1,
                       log_dir=root / "logs", control_module="fakecontrol", worker_module="fakeworker")
Supervisor(config).start()
threading.Event().wait()
"""


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, what: str = "") -> T:
    """Poll ``predicate`` until it is truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)
    return value


class Fakes:
    """The fake programs' directory, their events, and a supervisor factory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "fakecontrol.py").write_text(textwrap.dedent(FAKE_CONTROL))
        (root / "fakeworker.py").write_text(textwrap.dedent(FAKE_WORKER))
        self.events_path = root / "events"
        self.reports: list[str] = []
        self.made: list[Supervisor] = []

    def events(self) -> list[str]:
        return self.events_path.read_text().splitlines() if self.events_path.exists() else []

    def supervisor(self, workers: int = 2, env: dict[str, str] | None = None, **overrides: Any) -> Supervisor:
        settings: dict[str, Any] = {
            "grpc_port": 0,
            "http_port": 0,
            "db": str(self.root / "db"),
            "workers": workers,
            "threads": 3,
            "log_dir": self.root / "logs",
            "env": {
                "PYTHONPATH": f"{self.root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                "FAKE_EVENTS": str(self.events_path),
                "FAKE_DIR": str(self.root),
                **(env or {}),
            },
            "control_module": "fakecontrol",
            "worker_module": "fakeworker",
            "worker_args": ("--import", "x.y"),
            "ready_timeout_sec": 20,
            "worker_stop_timeout_sec": 10,
            "restart_backoff_sec": 0.05,
        }
        config = ClusterConfig(**{**settings, **overrides})
        sup = Supervisor(config, report=self.reports.append)
        self.made.append(sup)
        return sup


@pytest.fixture
def fakes(tmp_path: Path) -> Iterator[Fakes]:
    f = Fakes(tmp_path)
    yield f
    for sup in f.made:
        sup.request_kill()
        sup.stop()


def test_start_serves_then_stop_takes_workers_down_before_the_control_plane(fakes: Fakes) -> None:
    # Given a running cluster of a control plane and two workers
    sup = fakes.supervisor()
    sup.start()
    assert sup.grpc_port > 0 and sup.http_port > 0
    assert sup.grpc_address == f"127.0.0.1:{sup.grpc_port}"
    wait_for(lambda: sum(e.startswith("worker-started") for e in fakes.events()) == 2, what="two workers")
    started = [e for e in fakes.events() if e.startswith("worker-started")]
    assert all(f"--control 127.0.0.1:{sup.grpc_port} --threads 3 --import x.y" in e for e in started)
    assert any(f"http={sup.http_port}" in e for e in fakes.events())
    pids = sup.worker_pids()
    assert len(pids) == 2
    sup.check()  # nothing died: nothing to report
    assert fakes.reports == []

    # When it stops
    sup.stop()

    # Then every worker got SIGTERM and exited before the control plane got it, and nothing is left
    events = fakes.events()
    terms = [e for e in events if e.startswith(("worker-term", "control-term"))]
    assert sorted(terms[:2]) == sorted(f"worker-term {pid}" for pid in pids)
    assert terms[2:] == ["control-term"]
    assert sup.control.exit_code() == 0 and all(s.child.exit_code() == 0 for s in sup.workers)
    sup.stop()  # idempotent


def test_a_crashed_worker_is_reported_and_restarted(fakes: Fakes) -> None:
    # Given the next worker to start crashes at once
    (fakes.root / "crash-once").touch()
    sup = fakes.supervisor(workers=1)
    sup.start()
    slot = sup.workers[0]
    wait_for(lambda: slot.child.exit_code() == 1, what="the worker to crash")

    # When the supervisor checks until a worker runs again
    first_pid = slot.child.pid

    def restarted() -> bool:
        sup.check()
        return slot.child.running()

    wait_for(restarted, what="the restart")

    # Then the crash was reported, with its exit code, and a new process took its place
    assert slot.child.pid != first_pid
    assert any("worker 1" in r and "exited with code 1" in r and "restarting it in 0.05 s" in r for r in fakes.reports)
    assert any(r.startswith("worker 1 restarted") for r in fakes.reports)
    wait_for(lambda: any(e.startswith("worker-started") for e in fakes.events()), what="the new worker")


def test_a_worker_that_refuses_a_setting_stops_the_supervisor_instead_of_restarting(fakes: Fakes) -> None:
    # Given workers that exit 2 (a setting they refuse), as they would on every restart
    sup = fakes.supervisor(workers=1, env={"FAKE_WORKER_BAD_SETTING": "1"})
    sup.start()
    wait_for(lambda: sup.workers[0].child.exit_code() == 2, what="the worker to exit")
    # Then the check says why, with the worker's own message, and nothing was restarted
    with pytest.raises(WorkerRefusedSettings, match=r"worker 1 \(pid \d+\) exited with code 2") as info:
        sup.check()
    assert "CORRAL_WORKER_LABELS must be k=v pairs" in str(info.value)
    assert not any("restart" in r for r in fakes.reports)


def test_cluster_sizes_past_the_limits_are_refused(fakes: Fakes) -> None:
    # A typo (--threads 40000) would otherwise start that many processes
    with pytest.raises(SupervisorError, match=r"threads must be 1\.\.1024, got 1025"):
        fakes.supervisor(threads=1025)
    with pytest.raises(SupervisorError, match=r"workers must be 0\.\.256, got 257"):
        fakes.supervisor(workers=257)


def test_a_worker_that_exits_cleanly_is_not_restarted(fakes: Fakes) -> None:
    sup = fakes.supervisor(workers=1)
    sup.start()
    child = sup.workers[0].child
    wait_for(lambda: any(e.startswith("worker-started") for e in fakes.events()), what="the worker")
    child.signal(signal.SIGTERM)  # as if it had been drained
    wait_for(lambda: child.exit_code() == 0, what="the worker to exit")
    sup.check()
    sup.check()
    assert sup.workers[0].retired and not child.running()
    assert any("exited cleanly" in r for r in fakes.reports)


def test_a_dead_control_plane_stops_the_supervisor_with_the_reason(fakes: Fakes) -> None:
    sup = fakes.supervisor(workers=1)
    sup.start()
    (fakes.root / "die").touch()
    wait_for(lambda: sup.control.exit_code() is not None, what="the control plane to exit")
    with pytest.raises(ControlPlaneExited, match=r"control plane \(pid \d+\) exited with code 4"):
        sup.check()
    sup.stop()
    assert not any(s.child.running() for s in sup.workers)


def test_a_control_plane_that_cannot_start_fails_start_with_its_log(fakes: Fakes) -> None:
    sup = fakes.supervisor(env={"FAKE_CONTROL_FAIL": "1"})
    with pytest.raises(ControlPlaneExited) as info:
        sup.start()
    assert "exited with code 2 while starting" in str(info.value)
    assert "cannot open the database" in str(info.value)
    assert sup.workers == []


def test_a_worker_that_ignores_sigterm_is_killed_at_the_deadline(fakes: Fakes) -> None:
    sup = fakes.supervisor(workers=1, env={"FAKE_WORKER_IGNORE_TERM": "1"}, worker_stop_timeout_sec=0.3)
    sup.start()
    wait_for(lambda: any(e.startswith("worker-started") for e in fakes.events()), what="the worker")
    sup.stop()
    assert sup.workers[0].child.exit_code() == -signal.SIGKILL
    assert any("did not stop in time; killing it" in r for r in fakes.reports)
    assert sup.control.exit_code() == 0


def test_each_worker_gets_its_own_gpus_and_the_memory_and_the_control_plane_neither(fakes: Fakes) -> None:
    # Given a cluster of two workers that shares out three GPUs and gives each 8 GiB
    sup = fakes.supervisor(workers=2, gpus=("0", "1", "2"), memory_mb=8192)
    # When it starts
    sup.start()
    wait_for(lambda: sum(e.startswith("worker-started") for e in fakes.events()) == 2, what="two workers")
    # Then the workers' devices do not overlap (one device by its index is written "2,": "2" is a count)
    got = [(slot.child.env["CORRAL_WORKER_GPUS"], slot.child.env["CORRAL_WORKER_MEMORY_MB"]) for slot in sup.workers]
    assert got == [("0,1", "8192"), ("2,", "8192")]
    for name in ("CORRAL_WORKER_GPUS", "CORRAL_WORKER_MEMORY_MB"):
        assert sup.control.env.get(name) == os.environ.get(name)


def test_unset_gpus_and_memory_come_from_the_environment_or_the_machine_shared_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(corral.resources, "NVIDIA_GPUS_DIR", str(tmp_path / "none"))
    three = ClusterConfig(workers=3)
    # CORRAL_WORKER_GPUS in the environment is what the workers share; memory set there goes to each as it is
    shares = three.worker_envs({"CORRAL_WORKER_GPUS": "4", "CORRAL_WORKER_MEMORY_MB": "100"})
    assert [e["CORRAL_WORKER_GPUS"] for e in shares] == ["0,1", "2,", "3,"]
    assert {e["CORRAL_WORKER_MEMORY_MB"] for e in shares} == {"100"}
    # Without either, the devices an orchestrator gave (none found here) and the machine's memory, divided
    shares = three.worker_envs({"CUDA_VISIBLE_DEVICES": "GPU-a"})
    assert [e["CORRAL_WORKER_GPUS"] for e in shares] == ["GPU-a,", "0", "0"]
    assert {e["CORRAL_WORKER_MEMORY_MB"] for e in shares} == {str(corral.resources.detect_memory_mb() // 3)}
    assert [e["CORRAL_WORKER_GPUS"] for e in three.worker_envs({})] == ["0", "0", "0"]
    with pytest.raises(SupervisorError, match="CORRAL_WORKER_GPUS must list each device once"):
        three.worker_envs({"CORRAL_WORKER_GPUS": "a,a"})


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"gpus": tuple(f"g{i}" for i in range(65))}, r"gpus may list at most 64 devices, got 65"),
        ({"gpus": ("0", "0")}, r"gpus must list each device once"),
        ({"memory_mb": 0}, r"memory_mb must be 1\.\.1073741824, got 0"),
        ({"memory_mb": 2**30 + 1}, r"memory_mb must be 1\.\.1073741824, got 1073741825"),
    ],
)
def test_gpus_and_memory_past_the_limits_are_refused(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(SupervisorError, match=message):
        ClusterConfig(**settings)


def test_a_supervisor_killed_with_sigkill_takes_its_children_down(fakes: Fakes) -> None:
    # Given a supervisor, in a process of its own, with its control plane and two workers up
    env = {**os.environ, "PYTHONPATH": f"{fakes.root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env |= {"FAKE_EVENTS": str(fakes.events_path), "FAKE_DIR": str(fakes.root)}
    supervisor = subprocess.Popen([sys.executable, "-c", textwrap.dedent(SUPERVISOR), str(fakes.root)], env=env)
    children: list[int] = []
    try:
        wait_for(lambda: sum(e.startswith("worker-started") for e in fakes.events()) == 2, 30, "two workers")
        children = [int(e.split()[1]) for e in fakes.events() if e.startswith(("worker-started", "control-started"))]
        # When it is killed, with no chance to stop them itself
        supervisor.kill()
        supervisor.wait()
        # Then the kernel's SIGTERM reaches each of them, and each stops as it would on Ctrl-C
        wait_for(lambda: not any(alive(pid) for pid in children), what="the children to exit")
        terms = [e for e in fakes.events() if e.startswith(("worker-term", "control-term"))]
        assert sorted(terms) == ["control-term", *sorted(f"worker-term {pid}" for pid in children[1:])]
    finally:
        supervisor.kill()
        for pid in children:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_child_is_started_without_running_python_in_a_forked_copy_of_the_supervisor(fakes: Fakes) -> None:
    # The supervisor has gRPC's threads. Python run between fork and exec (a preexec_fn) can hang there, on
    # gRPC's fork handlers or on a lock another thread held at the fork, and the supervisor waits for that
    # exec with no timeout: a `corral up` that hung restarting a worker. Python's before-fork hooks run
    # exactly when Python will run in the forked copy.
    forks: list[int] = []
    os.register_at_fork(before=lambda: forks.append(1))
    sup = fakes.supervisor(workers=1)
    sup.start()
    wait_for(lambda: any(e.startswith("worker-started") for e in fakes.events()), what="the worker")
    assert sup.control.running() and sup.workers[0].child.running()
    assert forks == []


def test_a_log_dir_that_cannot_be_made_is_a_clear_error_that_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`corral up --log-dir` under a file printed a traceback and left its run directory in /tmp."""
    runs = tmp_path / "tmp"
    runs.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(runs))
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    with pytest.raises(SupervisorError, match=r"^log_dir: cannot make .*a-file/logs: Not a directory$"):
        Supervisor(ClusterConfig(grpc_port=0, http_port=0, log_dir=a_file / "logs"))
    assert list(runs.iterdir()) == []
