"""Timeout precision: how long after its deadline a job's process is gone.

Runs jobs straight through the worker's RunnerPool (real runner processes) with a 0.2 s timeout, for
three kinds of job: one that sleeps in the interpreter, one that ignores SIGTERM, and one blocked in
native code with SIGTERM masked (only SIGKILL, after CORRAL_KILL_GRACE_SEC, stops the last two).
The job writes its pid; the benchmark polls /proc every 0.5 ms and reports, per kind, the delay from
the deadline to the process being gone (median, p90, max), SIGTERM grace included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.report import table
from worker.attempt import Completion, JobSpec
from worker.pool import PoolConfig, RunnerPool

KINDS = ("pid_sleep", "pid_ignore_sigterm", "pid_native_block")
TIMEOUT_SEC = 0.2


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


async def _until(predicate: Callable[[], bool]) -> None:
    """Poll every 0.5 ms: a process's death in /proc has no event to wait on."""
    while not predicate():  # noqa: ASYNC110
        await asyncio.sleep(0.0005)


async def _one(pool: RunnerPool, kind: str, n: int, tmp: Path, results: dict[str, Completion]) -> float:
    pid_path = tmp / f"{kind}-{n}.pid"
    job_id = f"{kind}-{n}"
    await _until(lambda: pool.idle > 0)  # the killed process's replacement is ready
    deadline = time.time() + TIMEOUT_SEC
    payload = json.dumps({"pid_path": str(pid_path), "seconds": 30})
    pool.submit(JobSpec(job_id, 1, kind, payload, 1, deadline))
    await _until(lambda: pid_path.exists() and pid_path.read_text() != "")
    pid = int(pid_path.read_text())
    await _until(lambda: not _alive(pid))
    gone = time.time()
    await _until(lambda: job_id in results)
    assert results[job_id].outcome.name == "TIMEOUT", results[job_id]
    return (gone - deadline) * 1000


async def run_once(trials: int) -> dict[str, float]:
    results: dict[str, Completion] = {}

    def on_result(c: Completion) -> None:
        results[c.job_id] = c

    pool = RunnerPool(PoolConfig(slots=1, imports=("tests.support.probes",)), on_result)
    await pool.start()
    row: dict[str, float] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for kind in KINDS:
                delays = [await _one(pool, kind, i, Path(tmp), results) for i in range(trials)]
                row[f"{kind}_p50_ms"] = statistics.median(delays)
                row[f"{kind}_max_ms"] = max(delays)
    finally:
        await pool.stop()
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--trials", type=int, default=15)
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args(argv)
    os.environ.setdefault("PYTHONPATH", str(Path(__file__).resolve().parent.parent))
    rows = [asyncio.run(run_once(a.trials)) for _ in range(a.runs)]
    table(f"timeout precision: deadline -> process gone, {a.trials} jobs per kind, timeout {TIMEOUT_SEC}s", rows)


if __name__ == "__main__":
    main()
