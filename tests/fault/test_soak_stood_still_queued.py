"""A worker that stood still past the heartbeat timeout starts no attempt that waited in it for a runner.

Found by a chaos soak (SIGSTOP of workers past the heartbeat timeout): the stand-still check covered the
assignments a worker reads after it resumes, but not one it had read before and queued because no
runner process was free (its runner was being replaced after a timeout or a cancel killed its last
job). The control plane reaps the stopped worker and charges the attempt WORKER_LOST; when the
worker resumed, the replacement's READY was read before the stand-still was noticed, and the pool
started the queued attempt after the control plane had given up on it (beside the job's next attempt,
if that ran already). The pool now asks the connection first; the attempt stays queued, is listed
when the worker registers again, and the control plane kills it.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, wait_until
from tests.support.calls import executions, submit, wait_done

S = jobs_pb2.Job

IMPORT_SEC = 3.0
"""How long a runner process takes to start (tests.support.plugin_slow): the replacement of a killed
runner is not ready while the worker stands still."""


def test_an_attempt_queued_for_a_runner_is_not_started_after_the_worker_was_reaped(
    make_control_plane: Callable[..., ControlProc], spawn_worker: Any, tmp_path: Path
) -> None:
    cp = make_control_plane()  # heartbeat timeout 2 s (tests' FAST_ENV)
    worker = spawn_worker(
        cp,
        threads=1,
        imports=("tests.support.jobtypes", "tests.support.plugin_slow"),
        env={"CORRAL_TEST_IMPORT_SEC": str(IMPORT_SEC), "CORRAL_TEST_IMPORTED_LOG": str(tmp_path / "imported")},
    )
    runs, imported = tmp_path / "runs.log", tmp_path / "imported"
    # Given a job that times out: its runner process is killed, and the replacement takes a while
    slow = submit(cp, "record", {"path": str(runs), "seconds": 60}, timeout_sec=0.5, max_attempts=1)
    # and a job leased to the worker meanwhile, which waits in the worker for that replacement
    queued = submit(cp, "record", {"path": str(runs)}, max_attempts=3)
    wait_until(lambda: cp.get(queued.id).state == S.RUNNING, timeout=20, what="the second job leased")
    assert cp.get(slow.id).state == S.FAILED
    worker.signal(signal.SIGSTOP)
    try:
        # When the worker stands still until it is reaped (the queued attempt charged WORKER_LOST)
        wait_until(
            lambda: any(e.get("worker_id") == worker.worker_id for e in cp.events("worker_stale")),
            timeout=15,
            what="the stopped worker reaped",
        )
        wait_until(lambda: cp.get(queued.id).state != S.RUNNING, what="the queued attempt failed")
        # and its replacement runner got ready meanwhile (its READY waits in the pipe)
        wait_until(lambda: len(imported.read_text().split()) >= 2, timeout=20, what="the replacement runner ready")
    finally:
        worker.signal(signal.SIGCONT)
    # Then the job succeeds on its second attempt, and the first, given up on, never ran
    done = wait_done(cp, queued.id, timeout=60)
    assert (done.state, done.attempts) == (S.SUCCEEDED, 2), done.error
    assert [run for run in executions(runs) if run[0] == queued.id] == [(queued.id, 2)]
