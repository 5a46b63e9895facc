"""Retries with capped exponential backoff, the dead-letter queue, and RetryJob."""

from __future__ import annotations

from typing import Any

from control.backoff import backoff_ceiling
from corral.v1 import jobs_pb2
from tests.conftest import FAST_ENV, ControlProc
from tests.support.calls import submit, wait_done, watch

S = jobs_pb2.Job
BASE = float(FAST_ENV["CORRAL_BACKOFF_BASE_SEC"])
CAP = float(FAST_ENV["CORRAL_BACKOFF_CAP_SEC"])


def _secs(ts: Any) -> float:
    return float(ts.ToNanoseconds()) / 1e9


def test_fail_twice_then_succeed_with_backoff_between_attempts(control_plane: ControlProc, spawn_worker: Any) -> None:
    spawn_worker(control_plane, threads=1)
    events = watch(control_plane, submit(control_plane, "failing", {"fail_attempts": 2, "message": "not yet"}).id)
    done = events[-1]
    assert (done.state, done.attempts) == (S.SUCCEEDED, 3)
    # Each retry waited within [0, min(cap, base * 2^(n-1))] of the failure (full jitter).
    scheduled = [e for e in events if e.state == S.SCHEDULED]
    starts = {e.attempts: _secs(e.started_at) for e in events if e.state == S.RUNNING}
    assert [e.attempts for e in scheduled] == [1, 2]
    for e in scheduled:
        failed_at = _secs(e.started_at) + e.exec_seconds
        delay = _secs(e.ready_at) - _secs(e.finished_at) if e.HasField("finished_at") else None
        assert delay is None
        assert e.error.code == "ERROR" and "not yet" in e.error.message
        waited = _secs(e.ready_at) - failed_at
        assert -0.05 <= waited <= backoff_ceiling(e.attempts, base=BASE, cap=CAP) + 0.05
        assert starts.get(e.attempts + 1, _secs(done.started_at)) >= _secs(e.ready_at) - 0.01


def test_exhausted_attempts_fail_and_retry_job_redrives(control_plane: ControlProc, spawn_worker: Any) -> None:
    spawn_worker(control_plane, threads=1)
    job = submit(control_plane, "failing", {"fail_attempts": 3, "message": "boom"}, max_attempts=3)
    failed = wait_done(control_plane, job.id)
    assert (failed.state, failed.attempts, failed.error.code) == (S.FAILED, 3, "ERROR")
    assert failed.charged_attempts == 3
    stats = control_plane.jobs.GetStats(jobs_pb2.GetStatsRequest())
    assert stats.dead_letter >= 1
    # RetryJob re-drives it with a fresh budget; attempt 4 succeeds
    again = control_plane.jobs.RetryJob(jobs_pb2.RetryJobRequest(id=job.id))
    assert again.state in (S.PENDING, S.RUNNING, S.SUCCEEDED)
    done = wait_done(control_plane, job.id)
    assert (done.state, done.attempts) == (S.SUCCEEDED, 4)
    # 4 attempts of at most 3: the budget was fresh, so only the one since the retry is charged
    assert (done.charged_attempts, done.max_attempts) == (1, 3)


def test_retry_of_a_job_that_did_not_fail_is_refused(control_plane: ControlProc, spawn_worker: Any) -> None:
    import grpc

    spawn_worker(control_plane, threads=1)
    job = wait_done(control_plane, submit(control_plane, "noop").id)
    try:
        control_plane.jobs.RetryJob(jobs_pb2.RetryJobRequest(id=job.id))
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "SUCCEEDED" in (err.details() or "")
    else:
        raise AssertionError("retry of a SUCCEEDED job must fail")
