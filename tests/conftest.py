"""Shared fixtures: a real control plane and real workers, as subprocesses on 127.0.0.1.

- ``control_plane``: ``python -m control`` on ephemeral gRPC and HTTP ports (kept across restarts)
  over a SQLite file in tmp_path,
  with short heartbeat/backoff settings; ``make_control_plane(**env)`` for other settings.
- ``spawn_worker``: starts ``python -m worker`` processes (importing the test job types) and waits
  until each is registered; every process is stopped in teardown.
- ``postgres``: one throw-away PostgreSQL cluster for the session (``tests/support/postgres.py``);
  ``ControlProc.db_url`` runs a control plane on one of its databases.
- ``wait_until``: polls a condition with a deadline (tests never sleep to synchronise).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from corral.v1 import admin_pb2, admin_pb2_grpc, jobs_pb2, jobs_pb2_grpc
from tests.support.ports import free_port, silent_listener
from tests.support.postgres import Cluster, running_cluster

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")

FAST_ENV = {
    "WORKER_HEARTBEAT_TIMEOUT_SEC": "2",
    "CORRAL_HEARTBEAT_INTERVAL_SEC": "0.25",
    "CORRAL_BACKOFF_BASE_SEC": "0.2",
    "CORRAL_BACKOFF_CAP_SEC": "1",
    "CORRAL_BACKOFF_SEED": "7",
    "CORRAL_LEASE_GRACE_SEC": "2",
    "CORRAL_SHUTDOWN_GRACE_SEC": "2",
}


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.02, what: str = "") -> T:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def with_open_files(argv: list[str], limits: tuple[int, int] | None) -> list[str]:
    """``argv`` started with this soft and hard RLIMIT_NOFILE (None: as it is), as a systemd unit or a
    shell's ``ulimit -n`` would start it: a short Python step sets the limit, then execs ``argv`` in its
    place (same pid). Not a ``preexec_fn``: this process's gRPC threads run while it forks, and a child
    that ran Python code between fork and exec here once aborted in gRPC's poller."""
    if limits is None:
        return argv
    soft, hard = limits
    code = "import os, resource, sys; "
    code += f"resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard})); os.execv(sys.argv[1], sys.argv[1:])"
    return [sys.executable, "-c", code, *argv]


def interruptible(argv: list[str]) -> list[str]:
    """``argv`` started with SIGINT's default action, as from a terminal: a test run started in the
    background (a shell's ``&``) passes SIGINT on ignored, and a Python program started so ignores Ctrl-C
    (it installs no KeyboardInterrupt handler). A short Python step restores it, then execs ``argv``."""
    code = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
    return [sys.executable, "-c", code, *argv]


def base_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


@dataclass
class ControlProc:
    """A control plane subprocess; start/stop/kill keep the same port and database."""

    workdir: Path
    env: dict[str, str]
    port: int = 0
    http_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    _channel: grpc.Channel | None = None
    starts: int = 0
    token: str = ""
    """A client token: :meth:`workers`, :meth:`get` and :attr:`metadata` carry it (auth tests set it)."""
    tls_ca: Path | None = None
    """Set when the control plane speaks TLS: the channel verifies it against this CA."""
    worker_port: int = 0
    """The mutual-TLS worker port (0 unless CORRAL_TLS_CLIENT_CA is set)."""
    db_url: str = ""
    """A ``postgresql://`` store instead of the SQLite file :attr:`db`."""
    open_files: tuple[int, int] | None = None
    """The soft and hard RLIMIT_NOFILE the process starts with (None: this one's)."""

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """What a call needs to pass auth (nothing without :attr:`token`)."""
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    @property
    def db(self) -> Path:
        return self.workdir / "corral.db"

    @property
    def log(self) -> Path:
        return self.workdir / "control.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0, wait: bool = True) -> None:
        """Start the process; with ``wait`` (the default) return once it serves (see :meth:`wait_serving`)."""
        port_file = self.workdir / "control.port"
        http_port_file = self.workdir / "control.http.port"
        worker_port_file = self.workdir / "control.worker.port"
        port_file.unlink(missing_ok=True)
        http_port_file.unlink(missing_ok=True)
        worker_port_file.unlink(missing_ok=True)
        if self._channel is not None:  # a channel that saw the old process go away backs off: start afresh
            self._channel.close()
            self._channel = None
        self.starts += 1
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                with_open_files(
                    [
                        sys.executable,
                        "-m",
                        "control",
                        "--grpc-port",
                        str(self.port),
                        "--port-file",
                        str(port_file),
                        "--db",
                        self.db_url or str(self.db),
                        "--http-port",
                        str(self.http_port),
                        "--http-port-file",
                        str(http_port_file),
                        "--worker-port-file",
                        str(worker_port_file),
                    ],
                    self.open_files,
                ),
                cwd=ROOT,
                env=base_env(self.env),
                stdout=log,
                stderr=log,
            )
        if wait:
            self.wait_serving(timeout)

    def serving(self) -> bool:
        """True once the process has written its port file (it serves); fails the test if it exited."""
        proc = self.proc
        assert proc is not None
        if proc.poll() is not None:
            pytest.fail(f"control plane exited with {proc.returncode}:\n{self.log.read_text()[-3000:]}")
        port_file = self.workdir / "control.port"
        return port_file.exists() and port_file.read_text() != ""

    def start_standby(self, timeout: float = 20.0) -> None:
        """Start the process on a database another control plane leads, and wait until it stands by
        (its ``store_standby`` log line, and not serving as the leader)."""
        self.start(wait=False)
        wait_until(lambda: self.events("store_standby") and not self.serving(), timeout, what="a standby")

    def wait_serving(self, timeout: float = 20.0) -> None:
        """Wait until the process serves (a standby: until it has taken over) and read its ports."""
        port_file = self.workdir / "control.port"
        http_port_file = self.workdir / "control.http.port"
        worker_port_file = self.workdir / "control.worker.port"
        wait_until(self.serving, timeout, what="control plane to serve")
        self.port = int(port_file.read_text())
        self.http_port = int(http_port_file.read_text())  # written before the gRPC port file
        self.worker_port = int(worker_port_file.read_text())

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        """Signal the process and wait for it; returns its exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        self.proc = None
        return code

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def events(self, event: str) -> list[dict[str, Any]]:
        """The control plane's JSON log lines of ``event`` so far, parsed."""
        text = self.log.read_text().splitlines()
        lines = (json.loads(line) for line in text if line.startswith("{") and f'"{event}"' in line)
        return [line for line in lines if line.get("event") == event]

    def channel(self) -> grpc.Channel:
        if self._channel is None:
            # Connections of its own, as corral.Client's (tests/fault/test_client_channels.py): a channel
            # an earlier test left open to a port this control plane was given again must not fail its calls.
            options = [("grpc.use_local_subchannel_pool", 1)]
            if self.tls_ca is None:
                self._channel = grpc.insecure_channel(self.address, options=options)
            else:
                credentials = grpc.ssl_channel_credentials(self.tls_ca.read_bytes())
                self._channel = grpc.secure_channel(self.address, credentials, options=options)
        return self._channel

    @property
    def jobs(self) -> jobs_pb2_grpc.JobServiceStub:
        return jobs_pb2_grpc.JobServiceStub(self.channel())

    @property
    def admin(self) -> admin_pb2_grpc.AdminServiceStub:
        return admin_pb2_grpc.AdminServiceStub(self.channel())

    def workers(self) -> list[admin_pb2.Worker]:
        return list(self.admin.ListWorkers(admin_pb2.ListWorkersRequest(), timeout=10, metadata=self.metadata).workers)

    def get(self, job_id: str) -> jobs_pb2.Job:
        job: jobs_pb2.Job = self.jobs.GetJob(jobs_pb2.GetJobRequest(id=job_id), timeout=10, metadata=self.metadata)
        return job

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


@pytest.fixture
def silent_address() -> Iterator[str]:
    """A 127.0.0.1 address that accepts connections and never answers (tests.support.ports)."""
    with silent_listener() as address:
        yield address


@pytest.fixture(scope="session")
def postgres() -> Iterator[Cluster]:
    """One throw-away PostgreSQL cluster for the whole run (started on first use)."""
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture
def shared_pair(postgres: Cluster, tmp_path: Path) -> Iterator[tuple[ControlProc, ControlProc, str]]:
    """Two control planes on one new PostgreSQL database, and its URL. Each has fixed ports, so that
    workers and clients can list both before the second leads. The first is started and leads; the
    second is not started (``start_standby()`` makes it a standby)."""
    url = postgres.new_database()
    made = []
    for name in ("a", "b"):
        workdir = tmp_path / f"control-{name}"
        workdir.mkdir()
        made.append(ControlProc(workdir, dict(FAST_ENV), port=free_port(), http_port=free_port(), db_url=url))
    first, second = made
    try:
        first.start()
        yield first, second, url
    finally:
        for cp in made:
            cp.close()


@pytest.fixture
def make_control_plane(tmp_path: Path) -> Iterator[Callable[..., ControlProc]]:
    made: list[ControlProc] = []

    def make(**env: Any) -> ControlProc:
        workdir = tmp_path / f"control-{len(made)}"
        workdir.mkdir()
        cp = ControlProc(workdir, {**FAST_ENV, **{k: str(v) for k, v in env.items()}})
        made.append(cp)
        cp.start()
        return cp

    yield make
    for cp in made:
        cp.close()


@pytest.fixture
def control_plane(make_control_plane: Callable[..., ControlProc]) -> ControlProc:
    return make_control_plane()


@pytest.fixture(scope="module")
def refusing_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlProc]:
    """One control plane without workers, shared by a module's tests of calls it refuses or only reads.

    Starting one costs about 0.6 s, and a module can hold dozens of such cases. A test that uses it
    must leave it as it found it, with nothing stored, and check that it did: a case that stored a job
    then fails, and so do the cases after it.
    """
    cp = ControlProc(tmp_path_factory.mktemp("refusing-control"), dict(FAST_ENV))
    try:
        cp.start()
        yield cp
    finally:
        cp.close()


@dataclass
class WorkerProc:
    """A worker agent subprocess."""

    worker_id: str
    proc: subprocess.Popen[bytes]
    log: Path
    args: list[str] = field(default_factory=list)

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait(10)

    def wait(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout)


def registered_on(cp: ControlProc, worker: WorkerProc) -> bool:
    """Whether ``worker`` is registered (and not unavailable) on ``cp``."""
    return any(w.id == worker.worker_id and w.state != admin_pb2.Worker.UNAVAILABLE for w in cp.workers())


@pytest.fixture
def spawn_worker(tmp_path: Path) -> Iterator[Callable[..., WorkerProc]]:
    started: list[WorkerProc] = []

    def spawn(
        cp: ControlProc,
        threads: int = 1,
        slots: int | None = None,
        worker_id: str | None = None,
        imports: tuple[str, ...] = ("tests.support.jobtypes", "tests.support.probes"),
        env: dict[str, str] | None = None,
        wait: bool = True,
        address: str | None = None,
        open_files: tuple[int, int] | None = None,
    ) -> WorkerProc:
        wid = worker_id or f"w-{uuid.uuid4().hex[:8]}"
        control = address or cp.address  # e.g. the worker port, for mutual TLS
        args = [sys.executable, "-m", "worker", "--control", control, "--threads", str(threads), "--worker-id", wid]
        if slots is not None:
            args += ["--slots", str(slots)]
        for module in imports:
            args += ["--import", module]
        log = tmp_path / f"worker-{wid}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                with_open_files(args, open_files), cwd=ROOT, env=base_env(env), stdout=out, stderr=out
            )
        w = WorkerProc(wid, proc, log, args)
        started.append(w)
        if wait:

            def registered() -> bool:
                if proc.poll() is not None:
                    pytest.fail(f"worker exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
                return registered_on(cp, w)

            wait_until(registered, 20, what=f"worker {wid} to register")
        return w

    yield spawn
    for w in started:
        w.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            w.proc.wait(10)
