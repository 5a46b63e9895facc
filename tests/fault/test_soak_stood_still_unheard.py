"""A worker that stood still for less than the heartbeat timeout, but was heard from last longer ago than
that, starts nothing that was sent to it before it resumed.

Found by a chaos soak (SIGSTOP of workers near the heartbeat timeout): the worker judged a stand-still
by the gap between two ticks of its watchdog, which tick a few times per timeout, while the control
plane judges a worker by the time since it last heard from it, which can be up to a heartbeat interval
longer. A stop between the two lengths got the worker reaped and its jobs' attempts charged
WORKER_LOST, yet on resuming it started the assignments that had waited in its socket, as after no
stand-still at all: beside the jobs' next attempts.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, wait_until
from tests.support.calls import executions, submit, wait_done

S = jobs_pb2.Job

TIMEOUT_SEC = 4.0
INTERVAL_SEC = 3.0
"""Heartbeats far apart: the last one the control plane heard is up to 3 s older than the watchdog's
last tick (every TIMEOUT_SEC / 4)."""


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def test_an_assignment_read_after_the_worker_was_reaped_unheard_is_handed_back_unstarted(
    make_control_plane: Callable[..., ControlProc], spawn_worker: Any, tmp_path: Path
) -> None:
    cp = make_control_plane(WORKER_HEARTBEAT_TIMEOUT_SEC=TIMEOUT_SEC, CORRAL_HEARTBEAT_INTERVAL_SEC=INTERVAL_SEC)
    worker = spawn_worker(cp, threads=1)
    runs = tmp_path / "runs.log"
    registered = [e for e in cp.events("worker_registered") if e.get("worker_id") == worker.worker_id]
    # Given a worker stopped just before its first heartbeat (heard from last as it registered; its
    # watchdog ticked a second per second since)
    time.sleep(max(0.0, _epoch(registered[0]["ts"]) + INTERVAL_SEC - 0.3 - time.time()))
    worker.signal(signal.SIGSTOP)
    try:
        # and a job leased to it while it stands still, whose assignment waits in its socket
        job = submit(cp, "record", {"path": str(runs)}, max_attempts=3)
        wait_until(lambda: cp.get(job.id).state == S.RUNNING, what="the job leased to the stopped worker")
        # When the control plane reaps it, the first attempt failed with it
        wait_until(
            lambda: any(e.get("worker_id") == worker.worker_id for e in cp.events("worker_stale")),
            timeout=15,
            what="the stopped worker reaped",
        )
        wait_until(lambda: cp.get(job.id).state != S.RUNNING, what="the first attempt failed")
    finally:
        # and the worker resumes at once: it stood still less than the timeout (about 1.5 s)
        worker.signal(signal.SIGCONT)
    # Then the job succeeds on its second attempt, and the first never ran
    done = wait_done(cp, job.id, timeout=60)
    assert (done.state, done.attempts) == (S.SUCCEEDED, 2), done.error
    assert executions(runs) == [(job.id, 2)]
