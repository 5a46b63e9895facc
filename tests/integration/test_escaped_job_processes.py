"""Through a real control plane and a real worker: a process a job starts that leaves its runner's
process group (``setsid``, a double-forked daemon) ends with the job, whether the job returns, times
out or is cancelled, and the job ends in the right state.

The job (:mod:`tests.support.escaping_jobtypes`) writes the escaped pids to a file the test reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, wait_until
from tests.support.calls import submit, wait_done
from tests.support.processes import alive, children

S = jobs_pb2.Job
IMPORTS = ("tests.support.escaping_jobtypes",)


def _pids(path: Path) -> dict[str, Any] | None:
    try:
        pids: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return pids


def _only_runners(worker_pid: int) -> bool:
    """Whether every child of the worker is a live runner process (no zombie, no stray)."""
    pids = children(worker_pid)
    try:
        return bool(pids) and all(alive(p) and b"runner.serve" in Path(f"/proc/{p}/cmdline").read_bytes() for p in pids)
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("how", ["returns", "times_out", "cancelled"])
def test_a_process_that_left_the_group_ends_with_its_job(
    control_plane: ControlProc, spawn_worker: Any, tmp_path: Path, how: str
) -> None:
    # Given a worker, and a job that starts a setsid child and a double-forked daemon
    worker = spawn_worker(control_plane, threads=1, imports=IMPORTS)
    pid_path = tmp_path / "pids"
    payload = {"pid_path": str(pid_path), "seconds": 0 if how == "returns" else 300}
    limits = {"timeout_sec": 4.0} if how == "times_out" else {}
    job = submit(control_plane, "escape", payload, max_attempts=1, **limits)
    pids = wait_until(lambda: _pids(pid_path), timeout=30, what="the job to write the escaped pids")
    assert pids is not None
    escaped = [pids["setsid"], pids["daemon"]]
    try:
        assert all(pids["runner"] not in ids for ids in pids["groups"]), pids  # out of its group and session
        # When the job ends as it does
        if how == "cancelled":
            control_plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=job.id))
        done = wait_done(control_plane, job.id)
        # Then its state says how it ended
        expected = {
            "returns": (S.SUCCEEDED, ""),
            "times_out": (S.FAILED, "TIMEOUT"),
            "cancelled": (S.CANCELLED, ""),
        }[how]
        assert (done.state, done.error.code if how == "times_out" else "") == expected, done.error
        # and the processes that left its group are gone within a few seconds (before: they ran on for ever)
        wait_until(lambda: not any(alive(pid) for pid in escaped), timeout=10, what=f"{escaped} to end")
        # and the worker, which adopted them if their runner was killed, has reaped them: its children
        # are its runner processes, alive
        wait_until(lambda: _only_runners(worker.proc.pid), timeout=10, what="the worker's children to be its runners")
        # and the worker runs the next job
        after = wait_done(control_plane, submit(control_plane, "spawn_python").id)
        assert after.state == S.SUCCEEDED, after.error
    finally:
        for pid in escaped:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_a_job_that_raises_its_own_memory_limit_fails_memory_limit_and_the_next_runs(
    control_plane: ControlProc, spawn_worker: Any
) -> None:
    # Given a worker whose jobs may allocate 64 MiB, and a job that raises its soft RLIMIT_AS to the hard
    # limit before allocating 1 GiB
    spawn_worker(control_plane, threads=1, imports=IMPORTS, env={"CORRAL_JOB_MEMORY_LIMIT_MB": "64"})
    done = wait_done(control_plane, submit(control_plane, "raise_memory_limit", {"mib": 1024}, max_attempts=1).id)
    # Then it FAILED with MEMORY_LIMIT (before: it SUCCEEDED, past its limit)
    assert (done.state, done.error.code) == (S.FAILED, "MEMORY_LIMIT"), done
    # and the next job runs, a subprocess of its own included
    after = wait_done(control_plane, submit(control_plane, "spawn_python").id)
    assert after.state == S.SUCCEEDED, after.error
