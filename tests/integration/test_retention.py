"""Retention: finished jobs leave the store after CORRAL_JOB_RETENTION_SEC / CORRAL_FAILED_RETENTION_SEC."""

from __future__ import annotations

import signal
import time
from functools import partial
from typing import Any

import grpc
from google.protobuf import timestamp_pb2

from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, registered_on, wait_until
from tests.integration.test_health_metrics import scrape
from tests.integration.test_rest import Rest
from tests.support.calls import rpc_error, submit, wait_done

S = jobs_pb2.Job
RETENTION = 2.0


def _gone(cp: ControlProc, job_id: str) -> bool:
    try:
        cp.get(job_id)
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
        return True
    return False


def _stats(cp: ControlProc) -> dict[str, int]:
    return dict(cp.jobs.GetStats(jobs_pb2.GetStatsRequest(), timeout=10).jobs_by_status)


def test_finished_jobs_leave_the_store_after_their_retention(make_control_plane: Any, spawn_worker: Any) -> None:
    # Given succeeded and cancelled jobs kept 2 s, and failed ones (the dead-letter queue) kept for ever
    cp = make_control_plane(
        IDEMPOTENCY_TTL_SEC=RETENTION, CORRAL_JOB_RETENTION_SEC=RETENTION, CORRAL_FAILED_RETENTION_SEC=0
    )
    spawn_worker(cp, threads=2)
    done = [wait_done(cp, submit(cp, "noop").id) for _ in range(5)]
    failed = wait_done(cp, submit(cp, "failing", {"message": "no"}, max_attempts=1).id)
    later = timestamp_pb2.Timestamp()
    later.FromSeconds(int(time.time()) + 3600)
    cancelled = submit(cp, "noop", scheduled_at=later)
    cp.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=cancelled.id), timeout=10)
    assert [j.state for j in done] == [S.SUCCEEDED] * 5 and failed.state == S.FAILED

    # When their retention has passed, they are gone for every read
    ended = {j.id: j.finished_at.ToNanoseconds() / 1e9 for j in done}
    for job_id, finished in ended.items():
        wait_until(partial(_gone, cp, job_id), timeout=30, what=f"{job_id} purged")
        assert time.time() >= finished + RETENTION  # never before its time
    wait_until(lambda: _gone(cp, cancelled.id), timeout=30, what="the cancelled job purged")
    assert _stats(cp).get("SUCCEEDED", 0) == 0 and _stats(cp).get("CANCELLED", 0) == 0
    page = cp.jobs.ListJobs(jobs_pb2.ListJobsRequest(), timeout=10)
    assert [j.id for j in page.jobs] == [failed.id] and page.total == 1
    watch = rpc_error(lambda: list(cp.jobs.WatchJob(jobs_pb2.WatchJobRequest(id=done[0].id), timeout=10)))
    assert watch.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
    metrics = scrape(Rest(cp.http_port))
    assert metrics['corral_jobs_purged_total{state="SUCCEEDED"}'] == 5
    assert metrics['corral_jobs_purged_total{state="CANCELLED"}'] == 1

    # while the failed job stays, and can still be retried
    assert cp.get(failed.id).state == S.FAILED and _stats(cp)["FAILED"] == 1
    cp.jobs.RetryJob(jobs_pb2.RetryJobRequest(id=failed.id), timeout=10)
    assert wait_done(cp, failed.id).error.code == "ERROR"

    # and after a restart the counts agree with what is stored
    cp.stop()
    cp.start()
    assert _stats(cp).get("SUCCEEDED", 0) == 0 and _stats(cp)["FAILED"] == 1


def test_jobs_cancelled_by_a_failed_dependency_stay_while_it_does_and_come_back_with_its_retry(
    make_control_plane: Any, spawn_worker: Any
) -> None:
    # Given cancelled jobs kept 2 s and failed ones kept for ever, and a job that waits for one that fails
    cp = make_control_plane(
        IDEMPOTENCY_TTL_SEC=RETENTION, CORRAL_JOB_RETENTION_SEC=RETENTION, CORRAL_FAILED_RETENTION_SEC=0
    )
    worker = spawn_worker(cp, threads=1)
    soon = timestamp_pb2.Timestamp()
    soon.FromNanoseconds(time.time_ns() + 1_000_000_000)  # time to submit what waits for it
    root = submit(cp, "failing", {"message": "no"}, max_attempts=1, scheduled_at=soon)
    waiting = submit(cp, "noop", depends_on=[root.id])
    assert wait_done(cp, root.id).state == S.FAILED
    cancelled = wait_done(cp, waiting.id)
    assert (cancelled.state, cancelled.error.code) == (S.CANCELLED, "DEPENDENCY_FAILED")

    # When a job cancelled after it is purged: a sweep ran past the retention of both
    later = timestamp_pb2.Timestamp()
    later.FromSeconds(int(time.time()) + 3600)
    plain = submit(cp, "noop", scheduled_at=later)
    cp.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=plain.id), timeout=10)
    wait_until(lambda: _gone(cp, plain.id), timeout=30, what="the plain cancelled job purged")

    # Then the job cancelled by the failure is still there (it went with the plain ones, so a retry of the
    # failed job could no longer bring it back), and the retry brings it back. With no worker left: an idle
    # one would run the retried job at once, and its second failure cancel the dependent again before the
    # read below.
    assert cp.get(waiting.id).state == S.CANCELLED
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    wait_until(lambda: not registered_on(cp, worker), timeout=30, what="the drained worker gone")
    cp.jobs.RetryJob(jobs_pb2.RetryJobRequest(id=root.id), timeout=10)
    assert cp.get(waiting.id).state == S.SCHEDULED
    assert cp.get(root.id).state == S.PENDING
