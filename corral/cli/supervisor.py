"""The process supervisor behind ``corral up`` and ``corral demo``: one control plane and N workers.

:class:`Supervisor` starts ``python -m control`` (in its own process group, so a terminal's Ctrl-C reaches
only the supervisor, which then stops the children in order), waits until it serves (its ``--port-file``
holds the bound gRPC port and the gRPC health service "" answers SERVING), then starts the workers
``python -m worker --control H:P --threads T``, each with its own share of the machine's GPUs and memory
(CORRAL_WORKER_GPUS and CORRAL_WORKER_MEMORY_MB, see :meth:`ClusterConfig.worker_envs`). While it runs,
:meth:`Supervisor.check` notices children that died: a worker that crashed is restarted after a backoff
that doubles from :attr:`ClusterConfig.restart_backoff_sec` up to
:attr:`ClusterConfig.restart_backoff_cap_sec`; a worker that exited 0 (drained) is not; one that refused
a setting or a plug-in (exit 2) raises :class:`WorkerRefusedSettings`, since it would refuse it again on
every restart; a control plane that died raises :class:`ControlPlaneExited`, since the workers cannot do
anything without it. :meth:`Supervisor.stop` sends SIGTERM to the workers first (they drain), then to the
control plane, each with a deadline after which it sends SIGKILL.

Auth: with :attr:`ClusterConfig.token` the control plane accepts that client token (added to
``CORRAL_AUTH_TOKENS``) and the supervisor's own calls use it; the workers get the worker token
(:attr:`ClusterConfig.worker_token`, else ``$CORRAL_WORKER_TOKEN``, else a random one made for this run),
as ``CORRAL_WORKER_TOKEN``, and so does the control plane. Without a token nothing changes.

The children are in their own process groups, so a terminal's signals reach only the supervisor. Each
child asks the kernel for SIGTERM when the supervisor goes (see :mod:`corral.cli.child`), so even a
supervisor killed with SIGKILL leaves nothing running on unsupervised; the children then stop as they
would on Ctrl-C, though not in order.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from corral.cli.child import ChildProcess
from corral.client import Client
from corral.cluster import WorkerState
from corral.errors import CorralError
from corral.limits import MAX_MEMORY_MB, MAX_THREADS
from corral.resources import (
    ResourceError,
    check_gpus,
    detect_gpus,
    gpus_setting,
    memory_share_mb,
    parse_gpus,
    share_gpus,
)
from corral.transport import host_port

__all__ = ["ClusterConfig", "ControlPlaneExited", "Supervisor", "SupervisorError", "WorkerRefusedSettings"]

POLL_SEC = 0.1
"""How often waiting loops look at the children."""
MAX_LOCAL_WORKERS = 256
"""The most workers one ``corral up`` runs, all on this machine (a fleet runs ``corral worker`` per host)."""
BAD_SETTING_EXIT = 2
"""A worker's exit status for a setting or plug-in it refuses (``python -m worker``): not worth a restart."""

Report = Callable[[str], None]
"""Where the supervisor says what happens to its children (one line each)."""


class SupervisorError(Exception):
    """Raised when the cluster cannot be started or kept up; the message says why."""


class ControlPlaneExited(SupervisorError):
    """Raised when the control plane exits while the supervisor runs."""


class WorkerRefusedSettings(SupervisorError):
    """Raised when a worker exits because it refuses a setting or a plug-in: every restart would do the same."""


@dataclass(frozen=True)
class ClusterConfig:
    """What to run: where the control plane listens, its database, and the workers."""

    host: str = "127.0.0.1"
    grpc_port: int = 50051
    """0 picks a free port (the control plane reports it through its port file)."""
    http_port: int = 8080
    """0 picks a free port: the supervisor picks it just before the start (the port file names only gRPC's)."""
    db: str = "corral.db"
    workers: int = 2
    threads: int = 4
    """Threads per worker."""
    gpus: tuple[str, ...] | None = None
    """The GPU device ids the workers share out, each its own (so that no two jobs get one device);
    ``None``: those CORRAL_WORKER_GPUS names in the environment, else those found on this machine."""
    memory_mb: int | None = None
    """Memory in MiB each worker gives to jobs (1..); ``None``: CORRAL_WORKER_MEMORY_MB in the environment,
    else this machine's memory (or its cgroup's limit) shared out among the workers."""
    log_dir: Path | None = None
    """Children write their output to ``<log_dir>/control.log`` and ``worker-<n>.log``; ``None``: inherit."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables for the children."""
    ready_timeout_sec: float = 30.0
    worker_stop_timeout_sec: float = 30.0
    """How long workers may drain after SIGTERM before SIGKILL."""
    control_stop_timeout_sec: float = 15.0
    restart_backoff_sec: float = 0.5
    restart_backoff_cap_sec: float = 30.0
    healthy_run_sec: float = 60.0
    """A worker that ran this long before dying restarts after the initial backoff again."""
    worker_args: tuple[str, ...] = ()
    """Extra arguments for every worker, e.g. ``("--import", "my.jobtypes")``."""
    control_module: str = "control"
    """The module run as ``python -m`` for the control plane (tests substitute a fake)."""
    worker_module: str = "worker"
    token: str = field(default="", repr=False)
    """A client token: turns client auth on; the supervisor's own calls use it."""
    worker_token: str = field(default="", repr=False)
    """The local workers' token (with a client token and none given: $CORRAL_WORKER_TOKEN or a random one)."""

    def __post_init__(self) -> None:
        for name in ("grpc_port", "http_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise SupervisorError(f"{name} must be 0..65535, got {getattr(self, name)}")
        if not 0 <= self.workers <= MAX_LOCAL_WORKERS:
            raise SupervisorError(f"workers must be 0..{MAX_LOCAL_WORKERS}, got {self.workers}")
        if not 1 <= self.threads <= MAX_THREADS:
            raise SupervisorError(f"threads must be 1..{MAX_THREADS}, got {self.threads}")
        if self.gpus is not None:
            try:
                check_gpus(tuple(self.gpus), "gpus")
            except ResourceError as exc:
                raise SupervisorError(str(exc)) from None
        if self.memory_mb is not None and not 1 <= self.memory_mb <= MAX_MEMORY_MB:
            raise SupervisorError(f"memory_mb must be 1..{MAX_MEMORY_MB}, got {self.memory_mb}")

    def worker_envs(self, environ: Mapping[str, str]) -> list[dict[str, str]]:
        """CORRAL_WORKER_GPUS and CORRAL_WORKER_MEMORY_MB for each worker: every worker on one machine would
        find the same devices and the whole memory, and two jobs would then share a GPU, or together ask
        for more memory than there is. So each gets its own run of the devices (see :func:`share_gpus`)
        and, unless told otherwise, its part of the memory.

        Raises:
            SupervisorError: the environment's CORRAL_WORKER_GPUS (or CUDA_VISIBLE_DEVICES) breaks the rule.
        """
        env = {**environ, **self.env}
        try:
            if self.gpus is not None:
                devices = tuple(self.gpus)
            elif raw := env.get("CORRAL_WORKER_GPUS", "").strip():
                devices = parse_gpus(raw)
            else:
                devices = detect_gpus(env)
        except ResourceError as exc:
            raise SupervisorError(str(exc)) from None
        if self.memory_mb is not None:
            memory = str(self.memory_mb)
        elif raw := env.get("CORRAL_WORKER_MEMORY_MB", "").strip():
            memory = raw  # the worker checks it, and names it if it is wrong
        else:
            memory = str(memory_share_mb(self.workers))
        return [
            {"CORRAL_WORKER_GPUS": gpus_setting(share), "CORRAL_WORKER_MEMORY_MB": memory}
            for share in share_gpus(devices, self.workers)
        ]


@dataclass
class _WorkerSlot:
    index: int
    child: ChildProcess
    backoff: float
    restart_at: float | None = None
    retired: bool = False


class Supervisor:
    """Runs a control plane and its workers as child processes; see the module docstring.

    Use :meth:`start`, then :meth:`check` periodically (or :meth:`run` until :meth:`request_stop`), then
    :meth:`stop`; or ``with Supervisor(config) as sup:`` which starts and stops.
    """

    def __init__(self, config: ClusterConfig, report: Report | None = None) -> None:
        self.config = config
        self.report: Report = report or (lambda line: print(line, file=sys.stderr))
        if config.log_dir is not None:  # first: a directory that cannot be made leaves nothing behind
            try:
                config.log_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise SupervisorError(f"log_dir: cannot make {config.log_dir}: {exc.strerror or exc}") from None
        # Before the run directory is made: a host that cannot be listened on leaves nothing behind.
        self.http_port = config.http_port or _free_port(config.host)
        self._run_dir = Path(tempfile.mkdtemp(prefix="corral-up-"))
        self._port_file = self._run_dir / "control.port"
        self._stop_requested = threading.Event()
        self._kill_requested = threading.Event()
        self._stopped = False
        self.grpc_port = 0
        self._auth_env = _auth_env(config)
        self.control = ChildProcess("control plane", self._control_argv(), self._env(), self._log("control"))
        self.workers: list[_WorkerSlot] = []

    # -- addresses ------------------------------------------------------------------------------------

    @property
    def grpc_address(self) -> str:
        """``host:port`` of the control plane's gRPC server (known once :meth:`start` returned)."""
        return host_port(self.config.host, self.grpc_port)

    @property
    def http_address(self) -> str:
        """``http://host:port`` of the control plane's HTTP gateway."""
        return f"http://{host_port(self.config.host, self.http_port)}"

    def worker_pids(self) -> list[int]:
        """Process ids of the running workers."""
        return [slot.child.pid for slot in self.workers if slot.child.running()]

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the control plane, wait until it serves, then start the workers.

        Raises :class:`SupervisorError` when the control plane exits or is not serving within
        ``ready_timeout_sec``; returns early, with nothing more started, when a stop was requested.
        """
        self.control.start()
        self.grpc_port = self._wait_serving()
        if self.grpc_port == 0:
            return
        shares = self.config.worker_envs(self._env())
        for index in range(1, self.config.workers + 1):
            env = {**self._env(), **shares[index - 1]}
            child = ChildProcess(f"worker {index}", self._worker_argv(), env, self._log(f"worker-{index}"))
            child.start()
            self.workers.append(_WorkerSlot(index, child, self.config.restart_backoff_sec))

    def wait_for_workers(self, count: int | None = None, timeout: float | None = None) -> bool:
        """Wait until ``count`` (default: all) workers registered with the control plane; False on timeout."""
        want = self.config.workers if count is None else count
        deadline = time.monotonic() + (self.config.ready_timeout_sec if timeout is None else timeout)
        with Client(self.grpc_address, timeout=2, token=self.config.token or None) as client:
            while not self._stop_requested.is_set():
                self.check()
                try:
                    if sum(w.state is not WorkerState.UNAVAILABLE for w in client.workers()) >= want:
                        return True
                except CorralError:
                    pass  # not answering yet: keep waiting until the deadline
                if time.monotonic() >= deadline:
                    return False
                self._stop_requested.wait(POLL_SEC)
        return False

    def check(self) -> None:
        """Look at the children: report and restart crashed workers; raise if the control plane exited."""
        if self._stopped or self._stop_requested.is_set():
            return
        if not self.control.running():
            raise ControlPlaneExited(self._died(self.control))
        now = time.monotonic()
        for slot in self.workers:
            if slot.retired or slot.child.running():
                continue
            if slot.restart_at is None:
                if slot.child.exit_code() == 0:
                    slot.retired = True
                    self.report(f"{slot.child.name} (pid {slot.child.pid}) exited cleanly (drained); not restarting it")
                    continue
                if slot.child.exit_code() == BAD_SETTING_EXIT:
                    raise WorkerRefusedSettings(
                        self._died(slot.child, "(a setting or plug-in it refuses; not restarting it)")
                    )
                if now - slot.child.started_at >= self.config.healthy_run_sec:
                    slot.backoff = self.config.restart_backoff_sec
                slot.restart_at = now + slot.backoff
                self.report(f"{self._died(slot.child)}; restarting it in {slot.backoff:g} s")
                slot.backoff = min(self.config.restart_backoff_cap_sec, slot.backoff * 2)
            elif now >= slot.restart_at:
                slot.restart_at = None
                slot.child.start()
                self.report(f"{slot.child.name} restarted (pid {slot.child.pid})")

    def run(self) -> None:
        """Call :meth:`check` until :meth:`request_stop`; raises :class:`ControlPlaneExited`."""
        while not self._stop_requested.wait(POLL_SEC * 2):
            self.check()

    @property
    def stop_requested(self) -> bool:
        """True once :meth:`request_stop` (or :meth:`stop`) was called."""
        return self._stop_requested.is_set()

    def request_stop(self) -> None:
        """Ask :meth:`run` (and a :meth:`start` in progress) to return; the first call of a signal handler."""
        if self._stop_requested.is_set():
            self._kill_requested.set()
        self._stop_requested.set()

    def request_kill(self) -> None:
        """Make a :meth:`stop` in progress stop waiting for graceful exits and SIGKILL what is left."""
        self._stop_requested.set()
        self._kill_requested.set()

    def stop(self) -> None:
        """SIGTERM the workers and wait for them to drain, then the control plane; SIGKILL at the deadlines.

        Idempotent, and safe to call when :meth:`start` failed half-way.
        """
        if self._stopped:
            return
        self._stopped = True
        self._stop_requested.set()
        workers = [slot.child for slot in self.workers]
        self._terminate(workers, self.config.worker_stop_timeout_sec)
        self._terminate([self.control], self.config.control_stop_timeout_sec)
        shutil.rmtree(self._run_dir, ignore_errors=True)

    def __enter__(self) -> Supervisor:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- internals ------------------------------------------------------------------------------------

    def _wait_serving(self) -> int:
        deadline = time.monotonic() + self.config.ready_timeout_sec
        channel, channel_port = None, 0
        try:
            while not self._stop_requested.is_set():
                if not self.control.running():
                    raise ControlPlaneExited(self._died(self.control, "while starting"))
                port = _read_port(self._port_file)
                if port and port != channel_port:  # a port file read half-written names another port
                    if channel is not None:
                        channel.close()
                    channel, channel_port = grpc.insecure_channel(host_port(self.config.host, port)), port
                if channel is not None and _serving(channel):
                    return channel_port
                if time.monotonic() >= deadline:
                    raise SupervisorError(
                        f"control plane not serving after {self.config.ready_timeout_sec:g} s"
                        + _indent(self.control.tail())
                    )
                self._stop_requested.wait(POLL_SEC)
            return 0
        finally:
            if channel is not None:
                channel.close()

    def _terminate(self, children: list[ChildProcess], timeout: float) -> None:
        for child in children:
            child.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while any(c.running() for c in children):
            if self._kill_requested.is_set() or time.monotonic() >= deadline:
                for child in children:
                    if child.running():
                        self.report(f"{child.name} (pid {child.pid}) did not stop in time; killing it")
                        child.signal(signal.SIGKILL)
                for child in children:
                    if child.process is not None:
                        child.process.wait()
                break
            time.sleep(POLL_SEC / 2)

    def _died(self, child: ChildProcess, when: str = "") -> str:
        text = f"{child.name} (pid {child.pid}) {child.describe_exit()}" + (f" {when}" if when else "")
        return text + _indent(child.tail())

    def _log(self, name: str) -> Path | None:
        if self.config.log_dir is None:
            return None
        self.config.log_dir.mkdir(parents=True, exist_ok=True)
        return self.config.log_dir / f"{name}.log"

    def _env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONUNBUFFERED": "1", **self._auth_env, **self.config.env}

    def _control_argv(self) -> list[str]:
        c = self.config
        return [
            sys.executable,
            "-m",
            c.control_module,
            "--host",
            c.host,
            "--grpc-port",
            str(c.grpc_port),
            "--http-port",
            str(self.http_port),
            "--db",
            c.db,
            "--port-file",
            str(self._port_file),
        ]

    def _worker_argv(self) -> list[str]:
        c = self.config
        control = ["--control", self.grpc_address]
        return [sys.executable, "-m", c.worker_module, *control, "--threads", str(c.threads), *c.worker_args]


def _auth_env(config: ClusterConfig) -> dict[str, str]:
    """CORRAL_AUTH_TOKENS with the client token added, and CORRAL_WORKER_TOKEN for control and workers."""
    env: dict[str, str] = {}
    worker_token = config.worker_token
    if config.token:
        tokens = [t.strip() for t in os.environ.get("CORRAL_AUTH_TOKENS", "").split(",") if t.strip()]
        if not any(t.rpartition(":")[2] == config.token for t in tokens):
            tokens.append(config.token)
        env["CORRAL_AUTH_TOKENS"] = ",".join(tokens)
        worker_token = worker_token or os.environ.get("CORRAL_WORKER_TOKEN") or secrets.token_urlsafe(32)
    if worker_token:
        env["CORRAL_WORKER_TOKEN"] = worker_token
    return env


def _serving(channel: grpc.Channel) -> bool:
    try:
        response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
    except grpc.RpcError:
        return False
    return bool(response.status == health_pb2.HealthCheckResponse.SERVING)


def _read_port(path: Path) -> int:
    try:
        text = path.read_text().strip()
    except OSError:
        return 0
    return int(text) if text.isdigit() else 0


def _free_port(host: str) -> int:
    """A free port on ``host`` for the HTTP gateway (``--http-port 0``).

    Raises:
        SupervisorError: ``host`` is not an address of this machine (or does not resolve), said in one
            line as the control plane says it for a fixed port, rather than a traceback from ``bind``.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return int(sock.getsockname()[1])
    except OSError as exc:  # socket.gaierror is one: a name that does not resolve
        reason = exc.strerror or str(exc)
        raise SupervisorError(f"cannot listen on {host!r}: {reason} (is it an address of this machine?)") from None


def _indent(text: str) -> str:
    return "".join(f"\n    {line}" for line in text.splitlines())
