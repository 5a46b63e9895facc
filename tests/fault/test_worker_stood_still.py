"""A worker that stood still past the heartbeat timeout starts nothing that was sent to it before.

Found by a chaos soak: a worker stopped (SIGSTOP, a frozen VM) longer than the heartbeat timeout was
reaped and its jobs were given out again, but the assignments sent to it before that waited in its
socket; when it resumed it read them and started each one, beside the attempt that now ran the job.
Their results were refused as stale, yet the job's code had run twice. The worker now knows the
timeout (from Registered), notices the stand-still, hands such assignments back unstarted and
registers again.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, wait_until
from tests.support.calls import executions, submit, wait_done
from tests.support.processes import alive, children

S = jobs_pb2.Job


def test_an_assignment_read_after_the_worker_was_reaped_is_handed_back_unstarted(
    make_control_plane: Callable[..., ControlProc], spawn_worker: Any, tmp_path: Path
) -> None:
    cp = make_control_plane()  # heartbeat timeout 2 s (tests' FAST_ENV)
    worker = spawn_worker(cp, threads=1)
    runs = tmp_path / "runs.log"
    # Given a stopped worker, a job leased to it whose assignment waits in its socket
    worker.signal(signal.SIGSTOP)
    try:
        job = submit(cp, "record", {"path": str(runs)}, max_attempts=3)
        wait_until(lambda: cp.get(job.id).state == S.RUNNING, what="the job leased to the stopped worker")
        # and the worker reaped for its silence, the job's first attempt failed with it
        wait_until(
            lambda: any(e.get("worker_id") == worker.worker_id for e in cp.events("worker_stale")),
            timeout=15,
            what="the stopped worker reaped",
        )
        wait_until(lambda: cp.get(job.id).state != S.RUNNING, what="the first attempt failed")
    finally:
        # When it resumes, the first attempt's assignment is the first thing it reads
        worker.signal(signal.SIGCONT)
    # Then the job succeeds on its second attempt, and the first never ran
    done = wait_done(cp, job.id)
    assert (done.state, done.attempts) == (S.SUCCEEDED, 2), done.error
    assert executions(runs) == [(job.id, 2)]
    stalls = [json.loads(line) for line in worker.log.read_text().splitlines() if '"worker_stalled"' in line]
    assert stalls, "the worker did not notice it stood still"


def test_a_job_past_its_deadline_on_a_stopped_worker_is_ended_by_its_runner(
    make_control_plane: Callable[..., ControlProc], spawn_worker: Any, tmp_path: Path
) -> None:
    cp = make_control_plane(WORKER_HEARTBEAT_TIMEOUT_SEC=10)  # not reaped meanwhile: it sees the end itself
    worker = spawn_worker(cp, threads=1)
    (runner,) = children(worker.proc.pid)
    runs = tmp_path / "runs.log"
    # Given a job with a 0.5 s timeout that would run 60 s, running
    job = submit(cp, "record", {"path": str(runs), "seconds": 60}, timeout_sec=0.5, max_attempts=1)
    wait_until(lambda: executions(runs), what="the job to start")
    # When its worker, which stops a job at its deadline, stands still past that
    worker.signal(signal.SIGSTOP)
    try:
        # Then the job's runner process ends it by itself a moment after (before: it ran its full 60 s,
        # while the control plane, once it had counted the worker lost, ran it again elsewhere)
        wait_until(lambda: not alive(runner), timeout=10, what="the runner to end the job")
    finally:
        worker.signal(signal.SIGCONT)
    # and the worker, resumed, reports the attempt TIMEOUT, saying who ended it
    done = wait_done(cp, job.id)
    assert (done.state, done.error.code) == (S.FAILED, "TIMEOUT"), done.error
    assert "its runner process ended it" in done.error.message, done.error.message
    assert executions(runs) == [(job.id, 1)]
