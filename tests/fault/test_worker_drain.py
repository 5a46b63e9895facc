"""A worker drained while its control plane is away: what it finished is still delivered.

SIGTERM to a worker during a rolling deploy of the control plane: the jobs it runs finish while no
control plane listens. The drain keeps reconnecting and resending those results until they are
acknowledged, up to the worker's drain deadline (CORRAL_DRAIN_TIMEOUT_SEC); before, it waited 2 s,
then left with them, and the control plane counted the jobs lost (WORKER_LOST) and ran them again.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from corral.v1 import admin_pb2, jobs_pb2
from tests.conftest import ControlProc, WorkerProc, wait_until
from tests.support.calls import executions, submit, wait_done

S = jobs_pb2.Job
IMPORTS = ("tests.support.jobtypes", "tests.support.probes")


def _draining_lines(worker: WorkerProc) -> list[dict[str, Any]]:
    """The worker's ``worker_draining`` log lines so far, parsed."""
    lines = (json.loads(line) for line in worker.log.read_text().splitlines() if line.startswith("{"))
    return [line for line in lines if line.get("event") == "worker_draining"]


def _draining_on(cp: ControlProc, worker: WorkerProc) -> bool:
    return any(w.id == worker.worker_id and w.state == admin_pb2.Worker.DRAINING for w in cp.workers())


def test_a_drain_during_a_control_plane_restart_delivers_what_the_worker_finished(
    make_control_plane: Any, spawn_worker: Any, tmp_path: Path
) -> None:
    # Given a worker (drain deadline 30 s) running a job that has one attempt only
    cp: ControlProc = make_control_plane()
    log, hold = tmp_path / "runs.log", tmp_path / "hold"
    env = {"CORRAL_DRAIN_TIMEOUT_SEC": "30", "CORRAL_RECONNECT_MAX_SEC": "0.5"}
    worker = spawn_worker(cp, imports=IMPORTS, env=env)
    job = submit(cp, "record", {"path": str(log), "hold": str(hold)}, max_attempts=1)
    wait_until(lambda: executions(log), what="the job to start")
    # When the worker gets SIGTERM, and its control plane is stopped while it drains (a rolling deploy)
    worker.signal(signal.SIGTERM)
    wait_until(lambda: _draining_on(cp, worker), what="the worker to drain")
    assert cp.stop(signal.SIGTERM) == 0
    # and the job ends while no control plane listens, which stays away past the first wait for an ack
    hold.touch()
    wait_until(
        lambda: (
            worker.proc.poll() is not None or any(e.get("phase") == "awaiting_ack" for e in _draining_lines(worker))
        ),
        timeout=20,
        what="the worker to leave, or to wait on for the acknowledgement",
    )
    cp.start()
    # Then the result reaches the new control plane: the job succeeded, on its one attempt, run once
    done = wait_done(cp, job.id)
    assert (done.state, done.attempts, done.worker_id) == (S.SUCCEEDED, 1, worker.worker_id), done.error
    assert executions(log) == [(job.id, 1)]
    # and only then the worker leaves, exit 0, with nothing left unacknowledged
    assert worker.wait(30) == 0
    (last,) = [e for e in _draining_lines(worker) if e.get("phase") == "done"]
    assert (last["acked"], last["unacked"]) == (True, 0)
