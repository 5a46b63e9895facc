"""Job dependencies on a real control plane and real workers: a job with ``depends_on`` waits SCHEDULED
until every job it names has SUCCEEDED, then runs; if one of them ends FAILED or CANCELLED it is
CANCELLED with DEPENDENCY_FAILED, and so is what depends on it; waits survive a restart; bad ids are
refused naming the field, and nothing is stored."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import grpc

from corral.v1 import jobs_pb2
from tests.conftest import ROOT, ControlProc, base_env, wait_until
from tests.support.calls import request, rpc_error, seconds_from_now, submit, submit_many, wait_done

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
    a = submit(control_plane, "failing", {}, max_attempts=1, scheduled_at=seconds_from_now(0.5))
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
    a = submit(control_plane, "failing", {"fail_attempts": 1}, max_attempts=1, scheduled_at=seconds_from_now(0.5))
    y = submit(control_plane, "failing", {}, max_attempts=1, scheduled_at=seconds_from_now(0.5))
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
    a = submit(control_plane, "noop", scheduled_at=seconds_from_now(3600))
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
    failed = submit(control_plane, "noop", scheduled_at=seconds_from_now(3600))
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
    a = submit(control_plane, "noop", scheduled_at=seconds_from_now(2))
    b = submit(control_plane, "noop", depends_on=[a.id])
    (c,) = submit_many(control_plane, [request("noop", scheduled_at=seconds_from_now(3600))])
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


ALL_ENDED = jobs_pb2.StartWhen.ALL_ENDED


def test_a_job_that_starts_when_all_ended_runs_after_failures_too(
    control_plane: ControlProc, spawn_worker: Any
) -> None:
    spawn_worker(control_plane, threads=2)
    # Given A that fails, B that is cancelled, C that succeeds; D starts when all three ended, E when all
    # three succeeded
    a = submit(control_plane, "failing", {}, max_attempts=1, scheduled_at=seconds_from_now(0.5))
    b = submit(control_plane, "noop", scheduled_at=seconds_from_now(3600))
    c = submit(control_plane, "sleep", {"seconds": 0.2})
    d = submit(control_plane, "noop", depends_on=[a.id, b.id, c.id], start_when=ALL_ENDED)
    e = submit(control_plane, "noop", depends_on=[a.id, b.id, c.id])
    assert (d.state, d.start_when, sorted(d.waiting_on)) == (S.SCHEDULED, ALL_ENDED, sorted([a.id, b.id, c.id]))
    control_plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=b.id))
    # Then D runs once all three ended, and E is cancelled by the first that did not succeed
    done = {j.id: wait_done(control_plane, j.id) for j in (a, c, d, e)}
    assert (done[d.id].state, done[d.id].attempts) == (S.SUCCEEDED, 1)
    assert (done[e.id].state, done[e.id].error.code) == (S.CANCELLED, "DEPENDENCY_FAILED")
    for before in (a, c):
        assert done[d.id].started_at.ToNanoseconds() >= done[before.id].finished_at.ToNanoseconds()
    # A job that would start when all ended, after one that already failed, is taken and runs at once;
    # one that needs it to succeed is refused, saying what would take it
    late = submit(control_plane, "noop", depends_on=[a.id], start_when=ALL_ENDED)
    assert list(late.waiting_on) == [] and wait_done(control_plane, late.id).state == S.SUCCEEDED
    err = rpc_error(control_plane.jobs.SubmitJob, request("noop", depends_on=[a.id]))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "start_when ALL_ENDED" in (err.details() or "")


def test_a_wait_for_all_ended_survives_a_restart(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given D waiting for A and B to end, and A cancelled (so D waits for B only)
    a = submit(control_plane, "noop", scheduled_at=seconds_from_now(3600))
    b = submit(control_plane, "noop", scheduled_at=seconds_from_now(3600))
    (d,) = submit_many(control_plane, [request("noop", depends_on=[a.id, b.id], start_when=ALL_ENDED)])
    control_plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=a.id))
    wait_until(lambda: list(control_plane.get(d.id).waiting_on) == [b.id], what="D to wait for B only")
    # When the control plane restarts, D still waits (A's cancellation is an end, not a failure), for B
    control_plane.stop()
    control_plane.start()
    after = control_plane.get(d.id)
    assert (after.state, list(after.waiting_on), after.start_when) == (S.SCHEDULED, [b.id], ALL_ENDED)
    # and runs once B ends, however
    spawn_worker(control_plane, threads=1)
    control_plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=b.id))
    assert wait_done(control_plane, d.id).state == S.SUCCEEDED


def test_start_when_is_refused_where_it_means_nothing(control_plane: ControlProc) -> None:
    before = control_plane.jobs.ListJobs(jobs_pb2.ListJobsRequest()).total
    for req, rule in (
        (request("noop", start_when=ALL_ENDED), "start_when: applies only to a job with depends_on"),
        (request("noop", depends_on=["f" * 32], start_when=7), "start_when: must be ALL_SUCCEEDED or ALL_ENDED, got 7"),
    ):
        err = rpc_error(control_plane.jobs.SubmitJob, req)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and (err.details() or "").startswith(rule), err.details()
    assert control_plane.jobs.ListJobs(jobs_pb2.ListJobsRequest()).total == before


def test_the_cli_takes_start_when_and_shows_it(control_plane: ControlProc) -> None:
    def corral(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "corral.cli", *args, "--control", control_plane.address]
        return subprocess.run(argv, cwd=ROOT, env=base_env(), capture_output=True, text=True, timeout=60)

    first = submit(control_plane, "noop", scheduled_at=seconds_from_now(3600))
    done = corral("submit", "noop", "--after", first.id, "--start-when", "all_ended", "--json")
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)
    assert (job["start_when"], job["depends_on"]) == ("ALL_ENDED", [first.id])
    assert "ALL_ENDED" in corral("get", job["id"]).stdout
    refused = corral("submit", "noop", "--start-when", "sometimes")
    assert refused.returncode == 2 and "--start-when" in refused.stderr
