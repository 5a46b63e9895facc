"""Fleet size: the control plane's CPU per job with 2, 100 and 1,000 connected one-slot workers, and
the CPU it takes for the largest fleet, each worker running 20 jobs, to reconnect (after a restart).

Scheduling alone, in one process: the real scheduler, worker sessions and SQLite store, with every
worker's stream replaced by a stand-in that records its assignments (a thousand worker processes do not
fit on a small machine). The loop feeds each assignment back as a SUCCEEDED result, as a busy fleet
would: a result frees one slot and the dispatch pass that follows fills it, one message a loop turn. The figure is process CPU
per job over that loop; it should not grow with the fleet (``ratio`` is the largest fleet over the
smallest). ``reconnect_ms`` is the CPU to register every worker of the largest fleet again, each
reporting its 20 running jobs, as they all do when the control plane comes back; ``sweep_ms`` is the
CPU of one reaper sweep (lost workers, expired leases) with those 20,000 jobs running, which the
control plane does every second.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections import deque
from pathlib import Path

from bench.report import table
from control.admission import Submission
from control.clock import SystemClock
from control.config import ControlConfig
from control.reaper import Reaper
from control.registry import Assignment, AttemptKey
from control.scheduler import Scheduler
from control.sessions import Hello, Outcome, Report, WorkerSessions
from control.store import SQLiteStore

RECONNECT_SLOTS = 20
"""Running jobs per worker when the fleet reconnects."""
SWEEPS = 10
"""Reaper sweeps timed (each looks for lost workers and expired leases)."""


class _Stream:
    """A worker's stream as the scheduler sees it; assignments go into the shared ``outbox``."""

    def __init__(self, worker_id: str, outbox: deque[tuple[str, Assignment]]) -> None:
        self.worker_id, self.outbox = worker_id, outbox

    def assign(self, assignments: list[Assignment]) -> None:
        self.outbox.extend((self.worker_id, a) for a in assignments)

    def cancel(self, job_id: str, attempt: int) -> None: ...

    def ack(self, attempts: list[AttemptKey]) -> None: ...

    def drain(self, deadline_sec: float) -> None: ...

    def close(self) -> None: ...


class _Fleet:
    """The control plane's scheduling parts on a new store, and ``workers`` stand-in worker streams."""

    def __init__(self, workers: int, db: Path) -> None:
        self.store = SQLiteStore(str(db))
        self.scheduler = Scheduler(self.store, ControlConfig.from_env({}), SystemClock())
        self.sessions = WorkerSessions(self.scheduler)
        self.outbox: deque[tuple[str, Assignment]] = deque()
        self.streams = {f"w{i}": _Stream(f"w{i}", self.outbox) for i in range(workers)}


async def _cpu_per_job(workers: int, jobs: int, db: Path) -> float:
    fleet = _Fleet(workers, db)
    scheduler, sessions, outbox, streams = fleet.scheduler, fleet.sessions, fleet.outbox, fleet.streams
    try:
        for worker_id, stream in streams.items():
            sessions.register(Hello(worker_id, threads=1, slots=1), stream)
        for _ in range(0, jobs, 1000):
            await scheduler.intake.submit([Submission("noop", {}, payload_json="{}") for _ in range(1000)], batch=True)
        done, t0 = 0, time.process_time()
        while done < jobs - workers:  # the last ones have no job to follow them
            if not outbox:
                await asyncio.sleep(0)  # the dispatch pass runs on the next loop turn
                continue
            worker_id, a = outbox.popleft()
            now = time.time()
            report = Report(a.job_id, a.attempt, Outcome.SUCCEEDED, "{}", "", "", now, now)
            sessions.results(worker_id, [report], streams[worker_id])
            done += 1
            await asyncio.sleep(0)  # each worker's message in a loop turn of its own, as off a real stream
        return (time.process_time() - t0) / done * 1e6
    finally:
        fleet.store.close()


async def _reconnect_and_sweep(workers: int, slots: int, db: Path) -> tuple[float, float]:
    fleet = _Fleet(workers, db)
    scheduler, sessions, outbox, streams = fleet.scheduler, fleet.sessions, fleet.outbox, fleet.streams
    try:
        for start in range(0, workers * slots, 10000):
            count = min(10000, workers * slots - start)
            await scheduler.intake.submit([Submission("noop", {}, payload_json="{}") for _ in range(count)], batch=True)
        for i, (worker_id, stream) in enumerate(streams.items()):
            sessions.register(Hello(worker_id, threads=slots, slots=slots, hostname="h", pid=i), stream)
        for _ in range(100):  # the dispatch pass runs on the next loop turns
            if len(outbox) == workers * slots:
                break
            await asyncio.sleep(0)
        running: dict[str, dict[AttemptKey, int]] = {worker_id: {} for worker_id in streams}
        for worker_id, a in outbox:
            running[worker_id][(a.job_id, a.attempt)] = 1
        t0 = time.process_time()
        for i, (worker_id, stream) in enumerate(streams.items()):
            hello = Hello(worker_id, threads=slots, slots=slots, hostname="h", pid=i, running=running[worker_id])
            sessions.register(hello, stream)
        reconnect = time.process_time() - t0
        reaper = Reaper(scheduler)
        t0 = time.process_time()
        for _ in range(SWEEPS):
            reaper.sweep()
        return reconnect * 1000, (time.process_time() - t0) / SWEEPS * 1000
    finally:
        fleet.store.close()


def run_once(fleets: list[int], jobs: int) -> dict[str, float]:
    row: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in fleets:
            row[f"us_per_job_{n}_workers"] = asyncio.run(_cpu_per_job(n, jobs, Path(tmp) / f"{n}.db"))
        row["ratio"] = row[f"us_per_job_{max(fleets)}_workers"] / row[f"us_per_job_{min(fleets)}_workers"]
        big = asyncio.run(_reconnect_and_sweep(max(fleets), RECONNECT_SLOTS, Path(tmp) / "reconnect.db"))
        row["reconnect_ms"], row["sweep_ms"] = big
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--workers", type=int, nargs="+", default=[2, 100, 1000], help="fleet sizes")
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args(argv)
    table(
        f"fleet: control-plane CPU per job, {a.jobs} noop jobs, one-slot workers",
        [run_once(a.workers, a.jobs) for _ in range(a.runs)],
    )


if __name__ == "__main__":
    main()
