"""``corral up``: run a control plane and its workers in the foreground until Ctrl-C, SIGTERM or SIGHUP.

It prints where everything listens, then keeps the cluster up with :class:`Supervisor` (a crashed worker
is restarted after a backoff). The first Ctrl-C / SIGTERM / SIGHUP (its terminal closed) stops the
workers (they drain) and then the control plane, and exits 0; a second one kills what is left. If the control plane dies, the workers are
stopped and ``corral up`` exits 1 with the reason.
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from rich.markup import escape
from rich.table import Table

from corral.cli import render
from corral.cli.exitcode import ExitCode, fail
from corral.cli.supervisor import ClusterConfig, Supervisor, SupervisorError
from corral.client import Client
from corral.dburl import describe, is_postgres_url
from corral.errors import CorralError

__all__ = ["stop_signals", "up"]


def up(args: argparse.Namespace) -> int:
    """Run ``corral up`` with the parsed arguments; returns the exit status."""
    out, err = render.console(), render.console(stderr=True)
    try:
        config = ClusterConfig(
            host=args.host,
            grpc_port=args.grpc_port,
            http_port=args.http_port,
            db=args.db,
            workers=args.workers,
            threads=args.threads,
            gpus=args.gpus,
            memory_mb=args.memory_mb,
            log_dir=args.log_dir,
            ready_timeout_sec=args.ready_timeout,
            env=_log_env(args),
            token=args.token or "",
            worker_token=args.worker_token or "",
        )
        supervisor = Supervisor(config, report=lambda line: err.print(f"[yellow]corral up:[/] {line}"))
    except SupervisorError as exc:
        return fail(str(exc), ExitCode.USAGE)
    code = ExitCode.OK
    with stop_signals(supervisor.request_stop):
        try:
            out.print(f"Starting the control plane ([dim]{config.host}, db {describe(config.db)}[/])...")
            supervisor.start()
            registered = bool(supervisor.grpc_port) and supervisor.wait_for_workers()
            # A stop asked for while starting (Ctrl-C as the workers came up) ends the wait early: that
            # is neither "up" nor a timeout, so neither is said; the finally block stops what started.
            if supervisor.grpc_port and not supervisor.stop_requested:
                if not registered:
                    err.print(
                        f"[yellow]corral up:[/] not every worker registered within {config.ready_timeout_sec:g} s"
                    )
                out.print(_where(supervisor))
                out.print("Corral is up. Press Ctrl-C to stop.")
                supervisor.run()
        except SupervisorError as exc:
            first, *rest = str(exc).splitlines() or [""]
            code = fail(first)
            for line in rest:
                err.print(line, markup=False)
        finally:
            if supervisor.workers:
                out.print("Stopping: workers first (they drain), then the control plane...")
            else:  # it never served, or a stop came before any worker started
                out.print("Stopping the control plane...")
            supervisor.stop()
    out.print("Stopped." if code == ExitCode.OK else "Stopped after a failure.")
    return code


def _log_env(args: argparse.Namespace) -> dict[str, str]:
    """``--log-level`` / ``--log-format`` as the variables every child reads."""
    flags = (("CORRAL_LOG_LEVEL", args.log_level), ("CORRAL_LOG_FORMAT", args.log_format))
    return {name: value for name, value in flags if value}


@contextmanager
def stop_signals(handler: Callable[[], None]) -> Iterator[None]:
    """Route SIGINT, SIGTERM and SIGHUP to ``handler`` inside the block, and restore the previous handlers after it.

    SIGHUP is a closed terminal: left to its default it would end this process at once, and its children
    would all get SIGTERM together (see :mod:`corral.cli.child`), the control plane included, so the
    workers' last results would have no one to go to and those jobs would run again on the next start."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        handler()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _where(supervisor: Supervisor) -> Table:
    config = supervisor.config
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("gRPC", supervisor.grpc_address)
    table.add_row("HTTP", supervisor.http_address)
    table.add_row("web UI", f"{supervisor.http_address}/ui")
    table.add_row("database", describe(config.db) if is_postgres_url(config.db) else str(Path(config.db).resolve()))
    table.add_row("control", f"pid {supervisor.control.pid}")
    ids = _worker_ids(supervisor.grpc_address, config.token)
    workers = ", ".join(f"pid {pid}" + (f" ({ids[pid]})" if pid in ids else "") for pid in supervisor.worker_pids())
    table.add_row("workers", escape(f"{config.workers} x {_capacity(config)}: {workers or '-'}"))
    return table


def _capacity(config: ClusterConfig) -> str:
    """What each local worker gives to jobs: ``4 threads``; with ``--gpus`` and ``--memory-mb`` also
    ``4 threads, GPUs shared out: 0,1,2,3, 8192 MiB``."""
    parts = [f"{config.threads} threads"]
    if config.gpus:
        parts.append(f"GPUs shared out: {','.join(config.gpus)}")
    if config.memory_mb is not None:
        parts.append(f"{config.memory_mb} MiB")
    return ", ".join(parts)


def _worker_ids(address: str, token: str) -> dict[int, str]:
    try:
        with Client(address, timeout=2, token=token or None) as client:
            return {w.pid: w.id for w in client.workers() if w.pid}
    except CorralError:
        return {}
