"""``corral demo``: run a mix of the built-in job types and show them finish.

Without ``--control`` it starts an embedded Corral with the same :class:`Supervisor` as ``corral up``
(free ephemeral ports, a database in a temporary directory, 2 workers x 2 threads, children's logs in that
directory) and stops it at the end. It submits the mix in ``SubmitJobs`` batches, follows them all with
``WatchJobs`` (one stream per 10,000) on an :class:`~corral.AsyncClient` behind a live progress bar,
then prints a results table (checking the results it can predict) and a one-line summary. Exit 0 when
every job SUCCEEDED.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from corral.aio import AsyncClient
from corral.cli import commands, render
from corral.cli.demoboard import Check, DemoBoard
from corral.cli.exitcode import ExitCode, fail
from corral.cli.supervisor import ClusterConfig, Supervisor, SupervisorError
from corral.cli.up import stop_signals
from corral.errors import CorralError, RateLimited
from corral.job import Job
from corral.job_ids import MAX_WATCHED_JOBS
from corral.spec import JobSpec

__all__ = ["DemoJob", "demo", "demo_jobs"]

PRIME_LIMIT = 200_000_000
PRIMES_UP_TO_LIMIT = 11_078_937
"""pi(200,000,000): what ``cpu_intensive`` with n=PRIME_LIMIT must answer (about 0.5 s of work)."""

UNICODE_TEXT = "Corral ✓ — héllo, wörld! 日本語 🐎"
BATCH = 16
"""Jobs per SubmitJobs call (keeps every message well under gRPC's 4 MB default)."""


@dataclass(frozen=True)
class DemoJob:
    """One job of the demo and, when its result is predictable, how to check it."""

    spec: JobSpec
    check: Check | None = None


def demo_jobs(count: int, run_id: str) -> list[DemoJob]:
    """``count`` jobs cycling through the built-in types that need no server of their own to talk to
    (all but ``network_intensive``, ``webhook`` and ``email``), with results the demo can check."""
    makers = [_noop, _sleep, _add, _reverse, _array_sum, _resize, _cpu, _failing, _matmul, _monte_carlo, _io]
    jobs = []
    for i in range(count):
        job = makers[i % len(makers)](i)
        spec = dataclasses.replace(job.spec, name=f"demo-{i + 1:03d}", priority=i % 10, labels={"demo": run_id})
        jobs.append(DemoJob(spec, job.check))
    return jobs


def demo(args: argparse.Namespace) -> int:
    """Run ``corral demo`` with the parsed arguments; returns the exit status."""
    out, err = render.console(), render.console(stderr=True)
    jobs = demo_jobs(args.jobs, run_id=f"{int(time.time())}")
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        if args.control:
            token, control, tls_ca = commands.token_for(args), args.control, args.tls_ca
            return asyncio.run(
                _run(out, lambda: AsyncClient(control, token=token, tls_ca=tls_ca), jobs, None, args.timeout)
            )
        with tempfile.TemporaryDirectory(prefix="corral-demo-") as tmp:
            return _embedded(out, err, Path(tmp), jobs, args.timeout)
    except KeyboardInterrupt:
        return fail("interrupted", ExitCode.INTERRUPTED)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _embedded(out: Console, err: Console, tmp: Path, jobs: list[DemoJob], timeout: float) -> int:
    config = ClusterConfig(
        grpc_port=0, http_port=0, db=str(tmp / "corral.db"), workers=2, threads=2, log_dir=tmp / "logs"
    )
    supervisor = Supervisor(config, report=lambda line: err.print(f"[yellow]demo:[/] {line}", markup=True))
    try:
        with out.status("Starting an embedded Corral: a control plane and 2 workers x 2 threads..."):
            supervisor.start()
            if not supervisor.wait_for_workers():
                raise SupervisorError(f"the workers did not register within {config.ready_timeout_sec:g} s")
        out.print(
            f"Corral is up: gRPC [bold]{supervisor.grpc_address}[/], HTTP {supervisor.http_address}, "
            f"{config.workers} workers x {config.threads} threads"
        )
        address = supervisor.grpc_address
        return asyncio.run(_run(out, lambda: AsyncClient(address), jobs, supervisor, timeout))
    except SupervisorError as exc:
        first, *rest = str(exc).splitlines() or [""]
        code = fail(first)
        for line in rest:
            err.print(line, markup=False)
        return code
    finally:
        _stop(out, supervisor)


def _stop(out: Console, supervisor: Supervisor) -> None:
    """Stop the embedded Corral, under :func:`corral.cli.up.stop_signals` as ``corral up`` stops: a
    Ctrl-C or SIGTERM meanwhile makes it SIGKILL what is left, and it still waits for every child, so
    that none outlives the demo's temporary directory (database, logs), which goes next. A KeyboardInterrupt
    raised inside the stop used to abort it half-way, leaving the control plane running.

    Raises:
        KeyboardInterrupt: a signal came during the stop (after it has finished).
    """
    signalled: list[bool] = []

    def on_signal() -> None:
        signalled.append(True)
        supervisor.request_kill()

    with stop_signals(on_signal), out.status("Stopping Corral..."):
        supervisor.stop()
    if signalled:
        raise KeyboardInterrupt


async def _run(
    out: Console,
    connect: Callable[[], AsyncClient],
    jobs: list[DemoJob],
    supervisor: Supervisor | None,
    time_limit: float,
) -> int:
    """Submit ``jobs``, follow them to their ends and print the results; ``connect`` makes the client on
    this loop (a gRPC channel belongs to the loop it was made on)."""
    async with connect() as client:
        try:
            submitted = await _submit(client, [j.spec for j in jobs])
        except CorralError as exc:
            return fail(
                f"{exc.code}: {exc.message}", ExitCode.UNREACHABLE if exc.code == "UNAVAILABLE" else ExitCode.FAILED
            )
        types = ", ".join(dict.fromkeys(j.type for j in submitted))
        out.print(f"Submitted {len(submitted)} jobs in batches of {BATCH}: {types}")
        board = DemoBoard(submitted, [j.check for j in jobs])
        try:
            async with asyncio.timeout(time_limit):
                await _follow(out, client, board, supervisor)
        except TimeoutError:
            out.print(board.results_table())
            return fail(f"not every job finished within {time_limit:g} s")
        except CorralError as exc:
            return fail(f"{exc.code}: {exc.message}")
    out.print(board.results_table())
    out.print(board.summary_line())
    return ExitCode.OK if board.all_succeeded() else ExitCode.FAILED


async def _submit(client: AsyncClient, specs: list[JobSpec]) -> list[Job]:
    submitted: list[Job] = []
    for start in range(0, len(specs), BATCH):
        while True:
            try:
                submitted += await client.submit_many(specs[start : start + BATCH])
                break
            except RateLimited as exc:  # over the submission rate: wait as told, then send the batch again
                await asyncio.sleep(exc.retry_after)
    return submitted


async def _follow(out: Console, client: AsyncClient, board: DemoBoard, supervisor: Supervisor | None) -> None:
    columns = (
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=out, transient=False) as progress:
        task = progress.add_task(board.progress_text(), total=len(board.jobs))

        def refresh() -> None:
            progress.update(task, completed=board.finished(), description=board.progress_text())

        async def follow(ids: list[str]) -> None:
            async for update in client.watch_many(ids):
                board.update(update)
                refresh()

        ids = list(board.jobs)
        watchers = [
            asyncio.create_task(follow(ids[at : at + MAX_WATCHED_JOBS])) for at in range(0, len(ids), MAX_WATCHED_JOBS)
        ]
        guard = asyncio.create_task(_guard(supervisor)) if supervisor else None
        try:
            pending: set[asyncio.Task[None]] = set(watchers) | ({guard} if guard else set())
            while any(not t.done() for t in watchers):
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    error = t.exception()
                    if error is not None:
                        raise error
        finally:
            for t in (*watchers, *([guard] if guard else [])):
                t.cancel()
            await asyncio.gather(*watchers, *([guard] if guard else []), return_exceptions=True)
        refresh()


async def _guard(supervisor: Supervisor) -> None:
    """Fail the demo as soon as the embedded control plane dies (a crashed worker is restarted)."""
    while True:
        supervisor.check()
        await asyncio.sleep(0.5)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


# -- the mix --------------------------------------------------------------------------------------------


def _noop(i: int) -> DemoJob:
    return DemoJob(JobSpec("noop", {}), lambda r: not r)


def _sleep(i: int) -> DemoJob:
    seconds = 1 + (i // 8) % 3
    return DemoJob(JobSpec("sleep", {"seconds": seconds}), lambda r: r == {"slept": seconds})


def _add(i: int) -> DemoJob:
    a, b = 1000 + 37 * i, -17 * i
    return DemoJob(JobSpec("add_numbers", {"a": a, "b": b}), lambda r: r == {"sum": a + b})


def _reverse(i: int) -> DemoJob:
    text = f"{UNICODE_TEXT} #{i}"
    return DemoJob(JobSpec("reverse_string", {"text": text}), lambda r: r == {"reversed": text[::-1]})


def _array_sum(i: int) -> DemoJob:
    numbers = list(range(i, i + 20_000))
    total = sum(numbers)
    return DemoJob(JobSpec("large_array_sum", {"numbers": numbers}, thread_demand=2), lambda r: r == {"sum": total})


def _resize(i: int) -> DemoJob:
    payload = {"width": 1920, "height": 1080, "channels": 3, "target_width": 480, "target_height": 270}
    return DemoJob(
        JobSpec("resize_image", payload), lambda r: r is not None and (r["width"], r["height"]) == (480, 270)
    )


def _cpu(i: int) -> DemoJob:
    return DemoJob(
        JobSpec("cpu_intensive", {"n": PRIME_LIMIT}, thread_demand=2), lambda r: r == {"primes": PRIMES_UP_TO_LIMIT}
    )


def _failing(i: int) -> DemoJob:
    payload = {"fail_attempts": 1, "message": "the first attempt fails on purpose"}
    return DemoJob(JobSpec("failing", payload, max_attempts=3), lambda r: r == {"attempt": 2})


def _matmul(i: int) -> DemoJob:
    payload = {"n": 128, "m": 128, "k": 128, "seed": i}
    return DemoJob(
        JobSpec("matmul", payload, thread_demand=2),
        lambda r: r is not None and (r["rows"], r["cols"], r["inner"]) == (128, 128, 128),
    )


def _monte_carlo(i: int) -> DemoJob:
    samples = 2_000_000
    # Off by more than 0.01 is over 6 standard deviations at this many samples.
    return DemoJob(
        JobSpec("monte_carlo_pi", {"samples": samples, "seed": i}),
        lambda r: r is not None and r["samples"] == samples and abs(r["pi"] - math.pi) < 0.01,
    )


def _io(i: int) -> DemoJob:
    size = 8 << 20
    return DemoJob(
        JobSpec("io_intensive", {"size_bytes": size, "seed": i}), lambda r: r is not None and r["bytes"] == size
    )
