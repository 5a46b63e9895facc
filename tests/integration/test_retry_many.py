"""Re-driving many FAILED jobs in one call (RetryJobs), on a real control plane and real workers: every
FAILED job a filter matches, and nothing else, each with a fresh attempt budget and run again; at most
a limit, oldest first, with how many more matched; what a failure cancelled down the chain waits again;
one audit event per job; another client's jobs left alone. Over gRPC, REST, the Python clients and
``corral retry``; bad requests refused naming the field, changing nothing."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Callable
from typing import Any

import grpc
import pytest

import corral
from corral.errors import InvalidArgument, NotFound
from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, WorkerProc
from tests.integration.test_audit import Tenants, _events, tenants  # noqa: F401 (the fixture)
from tests.integration.test_cancel_many import _cancel
from tests.integration.test_health_metrics import scrape
from tests.integration.test_rest import Rest, http_port
from tests.support import cli
from tests.support.calls import request, result, rpc_error, seconds_from_now, submit, submit_many, wait_done

S = jobs_pb2.Job

FAIL_ONCE = {"fail_attempts": 1}
"""A ``failing`` payload whose first attempt fails and whose second succeeds."""


def _retry(cp: ControlProc, **fields: Any) -> jobs_pb2.RetryJobsResponse:
    answer: jobs_pb2.RetryJobsResponse = cp.jobs.RetryJobs(jobs_pb2.RetryJobsRequest(**fields), timeout=30)
    return answer


def _failed(cp: ControlProc, reqs: list[jobs_pb2.SubmitJobRequest]) -> list[jobs_pb2.Job]:
    """Submit ``reqs`` (one attempt each) and wait until every one has FAILED."""
    jobs = submit_many(cp, reqs)
    for job in jobs:
        assert wait_done(cp, job.id).state == S.FAILED
    return jobs


def _fail_once(**fields: Any) -> jobs_pb2.SubmitJobRequest:
    return request("failing", FAIL_ONCE, max_attempts=1, **fields)


def test_a_label_re_drives_every_failed_job_of_a_batch_and_nothing_else(
    control_plane: ControlProc, spawn_worker: Callable[..., WorkerProc]
) -> None:
    # Given batch a: four jobs that FAILED and one that SUCCEEDED; batch b: one that FAILED
    spawn_worker(control_plane, threads=2)
    batch = _failed(control_plane, [_fail_once(labels={"batch": "a"}) for _ in range(4)])
    succeeded = wait_done(control_plane, submit(control_plane, "noop", labels={"batch": "a"}).id)
    (other,) = _failed(control_plane, [_fail_once(labels={"batch": "b"})])
    # When batch a is re-driven in one call
    answer = _retry(control_plane, labels={"batch": "a"})
    # Then its four FAILED jobs are, oldest first, none left over, and each runs again and SUCCEEDS
    assert (list(answer.ids), answer.remaining) == ([j.id for j in batch], 0)
    for job in batch:
        done = wait_done(control_plane, job.id)
        assert (done.state, done.attempts, result(done)) == (S.SUCCEEDED, 2, {"attempt": 2})
    # and what was not of batch a, or had not failed, is as it was
    assert control_plane.get(other.id).state == S.FAILED
    assert control_plane.get(succeeded.id).attempts == 1
    # A second call finds nothing left to re-drive
    again = _retry(control_plane, labels={"batch": "a"})
    assert (list(again.ids), again.remaining) == ([], 0)
    # and the metrics count each job re-driven, by type
    assert scrape(Rest(http_port(control_plane)))['corral_jobs_redriven_total{type="failing"}'] == 4


def test_a_limit_takes_the_oldest_and_named_ids_narrow_with_the_rest(
    control_plane: ControlProc, spawn_worker: Callable[..., WorkerProc]
) -> None:
    spawn_worker(control_plane, threads=2)
    failed = _failed(control_plane, [_fail_once() for _ in range(5)])
    ok = wait_done(control_plane, submit(control_plane, "noop").id)
    # When two of the five are re-driven, Then the two oldest, and three more matched
    first = _retry(control_plane, type="failing", limit=2)
    assert (list(first.ids), first.remaining) == ([j.id for j in failed[:2]], 3)
    # Named ids narrow: a SUCCEEDED one among them is left as it is, the FAILED ones go, oldest first
    named = _retry(control_plane, ids=[failed[4].id, ok.id, failed[2].id])
    assert (list(named.ids), named.remaining) == ([failed[2].id, failed[4].id], 0)
    # and `all` takes the rest
    rest = _retry(control_plane, all=True)
    assert list(rest.ids) == [failed[3].id]
    for job in failed:
        assert wait_done(control_plane, job.id).state == S.SUCCEEDED


def test_the_dead_letter_queue_is_listed_and_re_driven_by_the_error_each_job_ended_with(
    control_plane: ControlProc, spawn_worker: Callable[..., WorkerProc]
) -> None:
    # Given jobs that FAILED two ways: two timed out, one raised
    spawn_worker(control_plane, threads=3)
    timed_out = _failed(
        control_plane, [request("sleep", {"seconds": 30}, timeout_sec=0.2, max_attempts=1) for _ in range(2)]
    )
    (raised,) = _failed(control_plane, [_fail_once()])
    assert {control_plane.get(j.id).error.code for j in timed_out} == {"TIMEOUT"}
    # Then the list by error code holds just the timeouts, over gRPC, REST, the client and the CLI
    listed = control_plane.jobs.ListJobs(jobs_pb2.ListJobsRequest(status=[S.FAILED], error_code="TIMEOUT"))
    assert ([j.id for j in listed.jobs], listed.total) == ([j.id for j in reversed(timed_out)], 2)
    rest = Rest(http_port(control_plane))
    reply = rest.call("GET", "/v1/jobs?errorCode=ERROR")
    assert reply.status == 200 and [j["id"] for j in reply.json()["jobs"]] == [raised.id]
    with corral.Client(control_plane.address) as client:
        assert client.list(status=["FAILED"], error_code="TIMEOUT").total == 2
    out = cli.corral("list", "--control", control_plane.address, "--error-code", "ERROR", "--json")
    assert out.returncode == 0 and [j["id"] for j in json.loads(out.stdout)["jobs"]] == [raised.id], out.stderr
    # The queue is not filtered by error
    queue = rpc_error(
        control_plane.jobs.ListJobs,
        jobs_pb2.ListJobsRequest(order=jobs_pb2.ListJobsRequest.QUEUE, error_code="TIMEOUT"),
    )
    assert queue.code() == grpc.StatusCode.INVALID_ARGUMENT and queue.details().startswith("error_code: ")
    # When only the one that raised is re-driven, by its error, Then it runs again; the timeouts stay
    answer = _retry(control_plane, error_code="ERROR")
    assert (list(answer.ids), answer.remaining) == ([raised.id], 0)
    assert wait_done(control_plane, raised.id).state == S.SUCCEEDED
    assert {control_plane.get(j.id).state for j in timed_out} == {S.FAILED}


def test_what_the_answer_names_is_committed_kill_9_right_after_loses_none(
    control_plane: ControlProc, spawn_worker: Callable[..., WorkerProc]
) -> None:
    # Given 50 FAILED jobs whose next attempt succeeds, and no worker left to run them
    worker = spawn_worker(control_plane, threads=2)
    failed = _failed(control_plane, [_fail_once() for _ in range(50)])
    worker.signal(signal.SIGTERM)  # it drains and leaves
    assert worker.wait(30) == 0
    # When they are re-driven and the control plane is killed the moment the answer arrives
    answer = _retry(control_plane, all=True)
    control_plane.kill()
    control_plane.start()
    assert list(answer.ids) == [j.id for j in failed]
    # Then after the restart none is FAILED, and each runs again once, to SUCCEEDED on attempt 2
    assert {control_plane.get(j.id).state for j in failed} == {S.PENDING}
    spawn_worker(control_plane, threads=2)
    for job in failed:
        done = wait_done(control_plane, job.id)
        assert (done.state, done.attempts) == (S.SUCCEEDED, 2)


def test_on_postgres_a_batch_is_cancelled_and_the_dead_letter_queue_re_driven_by_cause(
    shared_pair: tuple[ControlProc, ControlProc, str], spawn_worker: Callable[..., WorkerProc]
) -> None:
    # Given a control plane on PostgreSQL, jobs that FAILED two ways, and a batch scheduled for later
    cp, _, _ = shared_pair
    spawn_worker(cp, threads=2)
    raised = _failed(cp, [_fail_once() for _ in range(2)])
    timed_out = _failed(cp, [request("sleep", {"seconds": 30}, timeout_sec=0.2, max_attempts=1) for _ in range(2)])
    later = submit_many(cp, [request("noop", labels={"batch": "x"}, scheduled_at=seconds_from_now(3600))] * 3)
    # When the batch is cancelled, and the jobs that raised are listed and re-driven by their error
    assert list(_cancel(cp, labels={"batch": "x"}).ids) == [j.id for j in later]
    listed = cp.jobs.ListJobs(jobs_pb2.ListJobsRequest(status=[S.FAILED], error_code="ERROR"))
    assert [j.id for j in listed.jobs] == [j.id for j in reversed(raised)]
    assert list(_retry(cp, error_code="ERROR").ids) == [j.id for j in raised]
    for job in raised:
        assert wait_done(cp, job.id).state == S.SUCCEEDED
    # Then across a restart each is as the calls left it
    assert cp.stop() == 0
    cp.start()
    assert {cp.get(j.id).state for j in later} == {S.CANCELLED}
    assert {(cp.get(j.id).state, cp.get(j.id).attempts) for j in raised} == {(S.SUCCEEDED, 2)}
    assert {cp.get(j.id).state for j in timed_out} == {S.FAILED}


def test_what_a_failure_cancelled_down_the_chain_waits_again_and_runs(
    control_plane: ControlProc, spawn_worker: Callable[..., WorkerProc]
) -> None:
    # Given a job that FAILED, and one after it that its failure cancelled
    first = submit(control_plane, "failing", FAIL_ONCE, max_attempts=1)
    second = submit(control_plane, "noop", depends_on=[first.id])
    spawn_worker(control_plane, threads=2)
    assert wait_done(control_plane, first.id).state == S.FAILED
    assert wait_done(control_plane, second.id).state == S.CANCELLED
    # When the failed one is re-driven by id
    assert list(_retry(control_plane, ids=[first.id]).ids) == [first.id]
    # Then both run to SUCCEEDED, in order
    done_first, done_second = wait_done(control_plane, first.id), wait_done(control_plane, second.id)
    assert (done_first.state, done_second.state) == (S.SUCCEEDED, S.SUCCEEDED)
    assert done_second.started_at.ToNanoseconds() >= done_first.finished_at.ToNanoseconds()


def test_bad_requests_are_refused_naming_the_field_and_change_nothing(
    control_plane: ControlProc, spawn_worker: Callable[..., WorkerProc]
) -> None:
    spawn_worker(control_plane)
    (failed,) = _failed(control_plane, [request("failing", max_attempts=1, labels={"batch": "1"})])
    refusals: list[tuple[dict[str, Any], str]] = [
        ({}, "all: must be true to re-drive every FAILED job (no ids, type, owner, labels or error_code narrow it)"),
        ({"error_code": "E" * 65}, "error_code: must be at most 64 characters"),
        ({"all": True, "limit": -1}, "limit: must be between 1 and 1,000, got -1"),
        ({"all": True, "limit": 1_001}, "limit: must be between 1 and 1,000, got 1001"),
        ({"ids": [failed.id, failed.id]}, "ids[1]: repeats ids[0]"),
        ({"owner": "o" * 65}, "owner: "),
    ]
    for fields, message in refusals:
        err = rpc_error(_retry, control_plane, **fields)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details().startswith(message), (fields, err)
    missing = rpc_error(_retry, control_plane, ids=[failed.id, "no-such-job"])
    assert (missing.code(), missing.details()) == (grpc.StatusCode.NOT_FOUND, "job 'no-such-job' not found")
    assert control_plane.get(failed.id).state == S.FAILED
    # Over REST the same, JSON of the wrong types naming the field
    rest = Rest(http_port(control_plane))
    for body, field in (({"all": 1}, "all"), ({"ids": [1]}, "ids"), ({"status": ["FAILED"]}, "status"), ({}, "all")):
        reply = rest.post("/v1/jobs:retryMany", body)
        assert reply.status == 400 and field in reply.violation(), (body, reply.body)
    assert control_plane.get(failed.id).state == S.FAILED
    reply = rest.post("/v1/jobs:retryMany", {"labels": {"batch": "1"}})
    assert reply.status == 200 and json.loads(reply.body) == {"ids": [failed.id], "remaining": "0"}


def test_the_python_clients_and_the_cli(control_plane: ControlProc, spawn_worker: Callable[..., WorkerProc]) -> None:
    spawn_worker(control_plane, threads=2)
    ids = [j.id for j in _failed(control_plane, [request("failing", max_attempts=1) for _ in range(4)])]
    with corral.Client(control_plane.address) as client:
        assert client.retry_many(type="failing", limit=1) == corral.Changed(ids[:1], 3)
        with pytest.raises(InvalidArgument, match=r"^all: must be true"):
            client.retry_many()
        with pytest.raises(NotFound):
            client.retry_many(["no-such-job"])
        assert client.wait(ids[0], timeout=30).state.name == "FAILED"  # it fails again, every attempt

    async def retry_one() -> corral.Changed:
        async with corral.AsyncClient(control_plane.address) as aclient:
            return await aclient.retry_many([ids[1]])

    assert asyncio.run(retry_one()) == corral.Changed([ids[1]], 0)
    # `corral retry` with a filter, one at a time: it calls again until none is left
    out = cli.corral("retry", "--control", control_plane.address, "--type", "failing", "--limit", "2", "--json")
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert len(answer["retried"]) == 2 and set(answer["retried"]) <= set(ids)
    refused = cli.corral("retry", "--control", control_plane.address)
    assert refused.returncode != 0 and "field 'all': must be true" in refused.stderr


def test_a_client_re_drives_only_what_it_may_see_and_each_job_is_audited(tenants: Tenants) -> None:  # noqa: F811
    with tenants.client("alice") as alice, tenants.client("bob") as bob, tenants.client("ops") as ops:
        alices = [alice.wait(alice.submit("failing", max_attempts=1).id, timeout=30) for _ in range(2)]
        bobs = [bob.wait(bob.submit("failing", max_attempts=1).id, timeout=30) for _ in range(2)]
        assert {j.state.name for j in (*alices, *bobs)} == {"FAILED"}
        # When bob re-drives everything he can, Then only his jobs go
        assert bob.retry_many(all=True) == corral.Changed([j.id for j in bobs], 0)
        with pytest.raises(NotFound, match=alices[0].id):
            bob.retry_many([alices[0].id])
        assert bob.retry_many(owner="alice") == corral.Changed([], 0)
        assert {alice.get(j.id).attempts for j in alices} == {1}
        # while the admin re-drives alice's by owner
        assert ops.retry_many(owner="alice", limit=1) == corral.Changed([alices[0].id], 1)
        page = ops.audit(action="job.retry")
    assert _events(page) == [
        ("ops", "job.retry", alices[0].id, "OK"),
        ("bob", "job.retry", "jobs: 1 ids", "NOT_FOUND"),
        *[("bob", "job.retry", j.id, "OK") for j in reversed(bobs)],
    ]
