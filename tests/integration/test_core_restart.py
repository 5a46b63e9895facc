"""A control plane restarted after a running job's lease ended: the job's worker, not the clock of the
process that was down, says how the attempt went.

A real control plane on 127.0.0.1 with a real worker process and a real SQLite file."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, WorkerProc, wait_until
from tests.support.calls import executions, submit, wait_done

S = jobs_pb2.Job
TIMEOUT_SEC = 3.0
GRACE_SEC = 2.0  # CORRAL_LEASE_GRACE_SEC of the tests' control planes (tests/conftest.py FAST_ENV)
HEARTBEAT_TIMEOUT_SEC = 10.0
SWEEP_SEC = 1.0  # the reaper's interval for that heartbeat timeout: min(1, timeout / 4)


def test_a_result_finished_while_the_control_plane_was_down_is_not_thrown_away_as_an_expired_lease(
    make_control_plane: Any, spawn_worker: Any, tmp_path: Path
) -> None:
    """The recovered lease still ended where the old process had put it; the first sweep after the start
    failed the attempt LEASE_EXPIRED before the worker was back, and the result it then brought was
    refused as stale: the job ran again (or, on its last attempt, ended FAILED though it had succeeded)."""
    cp: ControlProc = make_control_plane(WORKER_HEARTBEAT_TIMEOUT_SEC=str(HEARTBEAT_TIMEOUT_SEC))
    worker: WorkerProc = spawn_worker(cp, env={"CORRAL_RECONNECT_MAX_SEC": "0.5"})
    log, hold = tmp_path / "runs.log", tmp_path / "hold"
    # Given a job running with one attempt and a 3 s timeout
    job = submit(cp, "record", {"path": str(log), "hold": str(hold)}, timeout_sec=TIMEOUT_SEC, max_attempts=1)
    wait_until(lambda: executions(log), what="the job to start")
    wait_until(lambda: cp.get(job.id).state == S.RUNNING, what="the job to be RUNNING")
    started = cp.get(job.id).started_at.ToSeconds()
    # When the control plane dies, the job succeeds meanwhile, and the control plane stays down past
    # the end of the job's lease (its timeout plus the grace): a slow restart, a rolling deploy
    cp.kill()
    hold.touch()
    wait_until(lambda: time.time() > started + TIMEOUT_SEC + GRACE_SEC + 0.5, timeout=20, what="the lease to end")
    # and it is back a few sweeps of its reaper before the worker reconnects
    worker.signal(signal.SIGSTOP)
    try:
        cp.start()
        back = time.monotonic()
        wait_until(lambda: time.monotonic() > back + 3 * SWEEP_SEC, timeout=10, what="three sweeps")
    finally:
        worker.signal(signal.SIGCONT)
    # Then the worker's result is taken: the job succeeded on its one attempt, run once
    done = wait_done(cp, job.id)
    assert (done.state, done.attempts, done.error.code) == (S.SUCCEEDED, 1, ""), done.error
    assert executions(log) == [(job.id, 1)]
    assert cp.events("lease_expired") == []
