"""Many faults at once, while jobs keep coming: workers killed (-9 and SIGTERM) and frozen, the control
plane killed, restarted and frozen, in an order drawn from a fixed seed.

What a user relies on through all of it: every acknowledged job succeeds, none is lost, and no job runs
more often than its attempts say (a re-run is always a new, counted attempt; no attempt runs twice).
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import pytest

from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, WorkerProc
from tests.support.calls import executions, request, wait_all_done

S = jobs_pb2.Job
SEED = 20261126
FAULTS = 14


def _submit_batch(cp: ControlProc, batch: int, log: Path, rng: random.Random) -> list[str]:
    """Submit 40 jobs under idempotency keys, again and again until acknowledged (the control plane may
    be down, or answer after committing with the answer lost): a retry returns the same jobs."""
    reqs = [
        request("record", {"path": str(log), "seconds": rng.choice([0, 0.01, 0.05, 0.3])}, max_attempts=50)
        for _ in range(40)
    ]
    for i, r in enumerate(reqs):
        r.idempotency_key = f"chaos-{batch}-{i}"
    while True:
        try:
            resp = cp.jobs.SubmitJobs(jobs_pb2.SubmitJobsRequest(jobs=reqs), timeout=5)
            return [j.id for j in resp.jobs]
        except grpc.RpcError:
            time.sleep(0.1)  # retry pacing while the control plane is away, not synchronisation


@pytest.mark.slow
def test_through_kills_restarts_and_freezes_no_job_is_lost_and_none_runs_twice_unnoticed(
    control_plane: ControlProc, spawn_worker: Any, tmp_path: Path
) -> None:
    cp = control_plane
    rng = random.Random(SEED)
    log = tmp_path / "runs.log"
    workers: list[WorkerProc] = [spawn_worker(cp, threads=3) for _ in range(3)]
    ids: list[str] = []
    done_faults: Counter[str] = Counter()
    stop = threading.Event()

    def submitter() -> None:
        batch = 0
        while not stop.is_set():
            ids.extend(_submit_batch(cp, batch, log, random.Random(batch)))
            batch += 1
            time.sleep(0.2)  # a steady trickle of work, not synchronisation

    thread = threading.Thread(target=submitter, daemon=True)
    thread.start()
    try:
        for _ in range(FAULTS):
            time.sleep(rng.uniform(0.5, 1.5))  # the chaos schedule itself
            fault = rng.choice(
                ["kill_worker", "term_worker", "freeze_worker", "kill_control", "term_control", "freeze"]
            )
            done_faults[fault] += 1
            i = rng.randrange(len(workers))
            if fault == "kill_worker":
                workers[i].kill()
                workers[i] = spawn_worker(cp, threads=3, wait=False)
            elif fault == "term_worker":
                workers[i].signal(signal.SIGTERM)
                workers[i].wait(60)
                workers[i] = spawn_worker(cp, threads=3, wait=False)
            elif fault == "freeze_worker":
                workers[i].signal(signal.SIGSTOP)
                time.sleep(rng.uniform(0.5, 4))  # how long it stands still: past the 2 s heartbeat timeout or not
                workers[i].signal(signal.SIGCONT)
            elif fault == "kill_control":
                cp.kill()
                cp.start()
            elif fault == "term_control":
                assert cp.stop(signal.SIGTERM) == 0
                cp.start()
            else:
                assert cp.proc is not None
                cp.proc.send_signal(signal.SIGSTOP)
                time.sleep(rng.uniform(0.5, 4))
                cp.proc.send_signal(signal.SIGCONT)
    finally:
        stop.set()
        thread.join(60)
    assert len(done_faults) >= 4, done_faults  # the seed draws a real mix
    # Then every acknowledged job succeeds
    done = wait_all_done(cp, ids, timeout=180)
    assert len(ids) >= 400 and len(set(ids)) == len(ids)
    assert {j.state for j in done} == {S.SUCCEEDED}
    # and each ran at most once per attempt it was given, its last attempt among them
    runs = Counter(executions(log))
    assert max(runs.values()) == 1, [key for key, n in runs.items() if n > 1][:5]
    per_job = Counter(job_id for job_id, _ in runs)
    assert all(per_job[j.id] <= j.attempts and runs[(j.id, j.attempts)] == 1 for j in done)
