"""Job dependencies on a real control plane and real workers: a job with ``depends_on`` waits SCHEDULED
until every job it names has SUCCEEDED, then runs; if one of them ends FAILED or CANCELLED it is
CANCELLED with DEPENDENCY_FAILED, and so is what depends on it; waits survive a restart; bad ids are
refused naming the field, and nothing is stored."""

from __future__ import annotations

import time
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, wait_until
from tests.support.calls import request, rpc_error, submit, submit_many, wait_done

S = jobs_pb2.Job


def test_a_chain_runs_in_order(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given two workers, and a job C that needs A and B, with B needing A
    spawn_worker(control_plane, threads=2)
    a = submit(control_plane, "sleep", {"seconds": 0.3})
    b = submit(control_plane, "sleep", {"seconds": 0.1}, depends_on=[a.id])
    c = submit(control_plane, "noop", depends_on=[a.id, b.id])
    # Then while A runs, B and C wait and say what for
    assert (b.state, list(b.waiting_on)) == (S.SCHEDULED, [a.id])
    assert (c.state, sorted(c.waiting_on)) == (S.SCHEDULED, sorted([a.id, b.id]))
    # and each starts only after what it depends on finished
    done_a, done_b, done_c = (wait_done(control_plane, j.id) for j in (a, b, c))
    assert {done_a.state, done_b.state, done_c.state} == {S.SUCCEEDED}
    assert done_b.started_at.ToNanoseconds() >= done_a.finished_at.ToNanoseconds()
    assert done_c.started_at.ToNanoseconds() >= done_b.finished_at.ToNanoseconds()
    assert list(done_c.depends_on) == [a.id, b.id] and list(done_c.waiting_on) == []


def test_a_failed_dependency_cancels_the_chain(control_plane: ControlProc, spawn_worker: Any) -> None:
    spawn_worker(control_plane, threads=2)
    # Given B waiting for A, and C waiting for B
    a = submit(control_plane, "failing", {}, max_attempts=1, scheduled_at=_in(0.5))
    b = submit(control_plane, "noop", depends_on=[a.id])
    c = submit(control_plane, "noop", depends_on=[b.id])
    other = submit(control_plane, "noop")
    # When A fails for good
    assert wait_done(control_plane, a.id).state == S.FAILED
    # Then B and C are cancelled, saying why, and never ran
    for job, cause in ((b, a), (c, b)):
        done = wait_done(control_plane, job.id)
        assert (done.state, done.error.code, done.attempts) == (S.CANCELLED, "DEPENDENCY_FAILED", 0)
        assert cause.id in done.error.message
    assert wait_done(control_plane, other.id).state == S.SUCCEEDED


def test_retrying_a_failed_dependency_brings_back_the_chain_its_failure_cancelled(
    control_plane: ControlProc, spawn_worker: Any
) -> None:
    spawn_worker(control_plane, threads=2)
    # Given A, which fails once (for good: one attempt), and Y, which fails for ever; B needs A, C needs B,
    # D needs A and Y, E needs A and a job that SUCCEEDED
    ok = submit(control_plane, "noop")
    assert wait_done(control_plane, ok.id).state == S.SUCCEEDED
    a = submit(control_plane, "failing", {"fail_attempts": 1}, max_attempts=1, scheduled_at=_in(0.5))
    y = submit(control_plane, "failing", {}, max_attempts=1, scheduled_at=_in(0.5))
    b = submit(control_plane, "noop", depends_on=[a.id])
    c = submit(control_plane, "noop", depends_on=[b.id])
    d = submit(control_plane, "noop", depends_on=[a.id, y.id])
    e = submit(control_plane, "noop", depends_on=[a.id, ok.id])
    assert wait_done(control_plane, a.id).state == S.FAILED
    assert wait_done(control_plane, y.id).state == S.FAILED
    for job in (b, c, d, e):
        assert wait_done(control_plane, job.id).error.code == "DEPENDENCY_FAILED"
    # When A is retried
    control_plane.jobs.RetryJob(jobs_pb2.RetryJobRequest(id=a.id))
    # Then its chain runs again after it, each job once: B, C and E; D could never start (Y failed), so
    # it stays cancelled
    done = {job.id: wait_done(control_plane, job.id) for job in (a, b, c, e)}
    assert {j.state for j in done.values()} == {S.SUCCEEDED}
    assert {done[j.id].attempts for j in (b, c, e)} == {1}
    assert done[b.id].started_at.ToNanoseconds() >= done[a.id].finished_at.ToNanoseconds()
    assert done[c.id].started_at.ToNanoseconds() >= done[b.id].finished_at.ToNanoseconds()
    assert done[e.id].error.code == "" and list(done[e.id].waiting_on) == []
    still = control_plane.get(d.id)
    assert (still.state, still.error.code, still.attempts) == (S.CANCELLED, "DEPENDENCY_FAILED", 0)
    # and the counts agree with the jobs
    stats = control_plane.jobs.GetStats(jobs_pb2.GetStatsRequest())
    counts = {state: n for state, n in stats.jobs_by_status.items() if n}
    assert counts == {"SUCCEEDED": 5, "FAILED": 1, "CANCELLED": 1}


def test_cancelling_a_dependency_cancels_its_dependents(control_plane: ControlProc) -> None:
    a = submit(control_plane, "noop", scheduled_at=_in(3600))
    b = submit(control_plane, "noop", depends_on=[a.id])
    control_plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=a.id))
    wait_until(lambda: control_plane.get(b.id).state == S.CANCELLED, what="the dependent to be cancelled")
    assert control_plane.get(b.id).error.code == "DEPENDENCY_FAILED"


def test_a_job_after_one_that_already_succeeded_runs_at_once(control_plane: ControlProc, spawn_worker: Any) -> None:
    spawn_worker(control_plane, threads=1)
    a = wait_done(control_plane, submit(control_plane, "noop").id)
    b = submit(control_plane, "noop", depends_on=[a.id])
    assert list(b.waiting_on) == [] and wait_done(control_plane, b.id).state == S.SUCCEEDED


def test_bad_dependencies_are_refused_naming_the_field(control_plane: ControlProc) -> None:
    failed = submit(control_plane, "noop", scheduled_at=_in(3600))
    control_plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=failed.id))
    before = control_plane.jobs.ListJobs(jobs_pb2.ListJobsRequest()).total
    for deps, code, said in (
        (["f" * 32], grpc.StatusCode.INVALID_ARGUMENT, "depends_on[0]: no job 'ffff"),
        ([failed.id], grpc.StatusCode.FAILED_PRECONDITION, "is CANCELLED; this job could never start"),
        ([failed.id, failed.id], grpc.StatusCode.INVALID_ARGUMENT, "depends_on[1]: repeats"),
        ([""], grpc.StatusCode.INVALID_ARGUMENT, "depends_on[0]: must be a job id"),
        (["x"] * 65, grpc.StatusCode.INVALID_ARGUMENT, "depends_on: at most 64 jobs"),
    ):
        err = rpc_error(control_plane.jobs.SubmitJob, request("noop", depends_on=deps))
        assert err.code() == code and said in (err.details() or ""), err.details()
    # in a batch, the field names the job too
    err = rpc_error(
        control_plane.jobs.SubmitJobs,
        jobs_pb2.SubmitJobsRequest(jobs=[request("noop"), request("noop", depends_on=["f" * 32])]),
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "jobs[1].depends_on[0]" in (err.details() or "")
    assert control_plane.jobs.ListJobs(jobs_pb2.ListJobsRequest()).total == before


def test_waits_survive_a_restart(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given B waiting for A, and D waiting for C, which is cancelled while the control plane is down
    a = submit(control_plane, "noop", scheduled_at=_in(2))
    b = submit(control_plane, "noop", depends_on=[a.id])
    (c,) = submit_many(control_plane, [request("noop", scheduled_at=_in(3600))])
    d = submit(control_plane, "noop", depends_on=[c.id])
    control_plane.stop()
    control_plane.start()
    # Then after the restart B still waits for A, then runs
    assert list(control_plane.get(b.id).waiting_on) == [a.id]
    spawn_worker(control_plane, threads=1)
    assert wait_done(control_plane, b.id).state == S.SUCCEEDED
    # and cancelling C still cancels D
    control_plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=c.id))
    wait_until(lambda: control_plane.get(d.id).state == S.CANCELLED, what="D to be cancelled")


def _in(seconds: float) -> Timestamp:
    """A time ``seconds`` from now."""
    ts = Timestamp()
    ts.FromNanoseconds(int((time.time() + seconds) * 1e9))
    return ts
