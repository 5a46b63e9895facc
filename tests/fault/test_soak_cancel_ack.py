"""Found by a chaos soak: a job could start after CancelJob had acknowledged its cancel.

A job leased to a worker is RUNNING as soon as the lease commits; its assignment may still be on its
way. CancelJob committed the cancel, sent the worker a cancel message behind the assignment, and
answered at once: the worker then read the assignment, started the job's process, and only after that
read the cancel. So the client was told "cancelled" and the job started afterwards (about 1 cancel in
100 of a job just submitted, in the soak; here deterministic, with the worker stopped while both
messages wait in its socket). CancelJob now answers once the worker has reported that attempt ended.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, wait_until
from tests.support.calls import executions, submit
from tests.support.waiting import in_thread

S = jobs_pb2.Job


def test_cancel_of_a_job_whose_assignment_is_on_its_way_answers_after_the_worker_stopped_it(
    make_control_plane: Callable[..., ControlProc], spawn_worker: Any, tmp_path: Path
) -> None:
    # A long heartbeat timeout: the stopped worker is not lost meanwhile (that would be another story).
    cp = make_control_plane(WORKER_HEARTBEAT_TIMEOUT_SEC=30)
    worker = spawn_worker(cp, threads=1)
    runs = tmp_path / "runs.log"
    worker.signal(signal.SIGSTOP)  # its runner processes go on; the worker reads nothing for now
    try:
        job = submit(cp, "record", {"path": str(runs)})
        wait_until(lambda: cp.get(job.id).state == S.RUNNING, what="the job leased to the stopped worker")

        def cancel() -> dict[str, Any]:
            answer = cp.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=job.id), timeout=25)
            # What had happened when the client was told: it must not change after this.
            reported = [e for e in cp.events("stale_result") if e.get("job_id") == job.id]
            return {"state": answer.state, "ran": executions(runs), "reported": bool(reported)}

        thread, out = in_thread(cancel)
        wait_until(
            lambda: any(e.get("job_id") == job.id for e in cp.events("job_cancelled")),
            what="the cancel committed and sent to the worker",
        )
    finally:
        worker.signal(signal.SIGCONT)  # it reads the assignment, then the cancel
    thread.join(30)
    assert "error" not in out, out.get("error")
    told = out["value"]
    assert told["state"] == S.CANCELLED
    # Answered only once the worker had reported the attempt ended (its process gone) ...
    assert told["reported"], "CancelJob answered before the worker stopped the job"
    # ... its process gone by then: whatever ran of it ran before the answer, and nothing after it.
    assert executions(runs) == told["ran"]
    assert cp.get(job.id).state == S.CANCELLED
