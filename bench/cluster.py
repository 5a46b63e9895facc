"""A local Corral for benchmarks: the control plane and workers as real processes on 127.0.0.1."""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

import grpc

from corral.client import SYNC_CHANNEL_OPTIONS
from corral.v1 import admin_pb2, admin_pb2_grpc, jobs_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent


def cpu_seconds_of(pid: int) -> float:
    """CPU time (user + system, every thread) process ``pid`` used so far; 0 once it is gone (a runner
    replaced meanwhile: its time is lost, a small undercount)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def add_postgres_flag(parser: argparse.ArgumentParser) -> None:
    """``--postgres URL``: run on PostgreSQL instead of SQLite (see :class:`Cluster`)."""
    parser.add_argument(
        "--postgres",
        default="",
        metavar="URL",
        help="run on PostgreSQL: a server URL whose user may create databases (each run gets a new one)",
    )


def store_name(postgres: str) -> str:
    """The store a run used, for a table's title."""
    return "PostgreSQL" if postgres else "SQLite"


class Cluster:
    """``with Cluster(workers=2, threads=4) as c: c.jobs.SubmitJobs(...)``.

    With ``token``, auth is on: the control plane accepts that client token, the workers get a random
    worker token, and every call must pass ``metadata=c.metadata`` (``authorization: Bearer <token>``).
    """

    def __init__(
        self,
        workers: int = 2,
        threads: int = 4,
        imports: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        token: str | None = None,
        postgres: str = "",
    ) -> None:
        self.n_workers = workers
        self.threads = threads
        self.imports = imports
        auth = {"CORRAL_AUTH_TOKENS": token, "CORRAL_WORKER_TOKEN": secrets.token_urlsafe(32)} if token else {}
        self.metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        """Metadata every call needs (empty without a token)."""
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "CORRAL_LOG_LEVEL": "warning", **auth, **(env or {})}
        self.tmp = tempfile.TemporaryDirectory(prefix="corral-bench-")
        self.procs: list[subprocess.Popen[bytes]] = []
        self.port = 0
        self.postgres = postgres
        self.db = ""
        """The store: a SQLite file in a temporary folder, or a new PostgreSQL database on the server at
        ``postgres`` (a URL whose user may create databases), dropped at exit."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> Cluster:
        self.db = self._new_postgres_database() if self.postgres else str(Path(self.tmp.name) / "bench.db")
        self._start_control()
        self.channel = grpc.insecure_channel(self.address, options=SYNC_CHANNEL_OPTIONS)  # as corral.Client's
        self.jobs = jobs_pb2_grpc.JobServiceStub(self.channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(self.channel)
        for _ in range(self.n_workers):
            self.add_worker()
        self.wait_for_workers(self.n_workers)
        return self

    def _start_control(self, timeout: float = 600.0) -> None:
        """Start the control plane (on the port it had, after the first start) and wait until it serves."""
        tmp = Path(self.tmp.name)
        port_file = tmp / "port"
        port_file.unlink(missing_ok=True)
        self.control = subprocess.Popen(
            [sys.executable, "-m", "control", "--grpc-port", str(self.port), "--port-file", str(port_file),
             "--http-port", "0", "--http-port-file", str(tmp / "http.port"), "--db", self.db],
            cwd=ROOT, env=self.env,
        )  # fmt: skip
        self.procs.insert(0, self.control)
        deadline = time.monotonic() + timeout
        while not (port_file.exists() and port_file.read_text()):
            if time.monotonic() > deadline or self.control.poll() is not None:
                raise RuntimeError("control plane did not start")
            time.sleep(0.02)
        self.port = int(port_file.read_text())
        self.http_port = int((tmp / "http.port").read_text())

    def _new_postgres_database(self) -> str:
        import psycopg  # only for a PostgreSQL run

        self._pg_name = f"corral_bench_{secrets.token_hex(6)}"
        with psycopg.connect(self.postgres, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {self._pg_name}")
        parts = urlsplit(self.postgres)
        return urlunsplit(parts._replace(path=f"/{self._pg_name}"))

    def _drop_postgres_database(self) -> None:
        import psycopg  # only for a PostgreSQL run

        with psycopg.connect(self.postgres, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {self._pg_name} WITH (FORCE)")

    def restart_control(self) -> float:
        """Stop the control plane (SIGTERM) and start it again on the same store; returns the seconds
        from the start until it serves (it loads every unfinished job first)."""
        self.control.send_signal(signal.SIGTERM)
        self.control.wait(60)
        self.procs.remove(self.control)
        t0 = time.perf_counter()
        self._start_control()
        return time.perf_counter() - t0

    def wait_for_workers(self, n: int, timeout: float = 30.0) -> None:
        """Block until ``n`` workers are registered."""
        deadline = time.monotonic() + timeout
        while len(self.admin.ListWorkers(admin_pb2.ListWorkersRequest(), metadata=self.metadata).workers) < n:
            if time.monotonic() > deadline:
                raise RuntimeError("workers did not register")
            time.sleep(0.02)

    def add_worker(self) -> subprocess.Popen[bytes]:
        args = [sys.executable, "-m", "worker", "--control", self.address, "--threads", str(self.threads)]
        for module in self.imports:
            args += ["--import", module]
        proc = subprocess.Popen(args, cwd=ROOT, env=self.env)
        self.procs.append(proc)
        return proc

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time (user + system) used so far by the control plane, the worker agents, their runner
        processes and this client: deltas over a run give each part's CPU per job."""

        def children(pid: int) -> list[int]:
            out: list[int] = []
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError):
                    out += [int(c) for c in (task / "children").read_text().split()]
            return out

        workers = [p.pid for p in self.procs[1:] if p.poll() is None]
        return {
            "control": cpu_seconds_of(self.control.pid),
            "workers": sum(cpu_seconds_of(w) for w in workers),
            "runners": sum(cpu_seconds_of(r) for w in workers for r in children(w)),
            "client": cpu_seconds_of(os.getpid()),
        }

    def rss_mb(self) -> float:
        """Resident memory of the control plane, in MB."""
        for line in Path(f"/proc/{self.control.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.channel.close()
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        self.tmp.cleanup()
        if self.postgres:
            self._drop_postgres_database()
