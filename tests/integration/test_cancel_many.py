"""Cancelling many jobs in one call (CancelJobs), on a real control plane and real workers: every
unfinished job a filter matches, and nothing else; running ones killed, queued ones never run; at
most a limit, oldest first, with how many more matched; what waits on them cancelled in turn; one
audit event per job; another client's jobs left alone. Over gRPC, REST, the Python clients and
``corral cancel``; bad requests refused naming the field, changing nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import grpc
import pytest

import corral
from corral.errors import InvalidArgument, NotFound
from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, WorkerProc, wait_until
from tests.integration.test_audit import Tenants, _events, tenants  # noqa: F401 (the fixture)
from tests.integration.test_health_metrics import scrape
from tests.integration.test_rest import Rest, http_port
from tests.support import cli
from tests.support.calls import request, rpc_error, seconds_from_now, submit, submit_many, wait_done

S = jobs_pb2.Job


def _cancel(cp: ControlProc, **fields: Any) -> jobs_pb2.CancelJobsResponse:
    answer: jobs_pb2.CancelJobsResponse = cp.jobs.CancelJobs(jobs_pb2.CancelJobsRequest(**fields), timeout=30)
    return answer


def test_a_label_cancels_every_unfinished_job_of_a_batch_and_nothing_else(
    control_plane: ControlProc, spawn_worker: Callable[..., WorkerProc]
) -> None:
    # Given batch 7: one job that already ended, two that run, two queued behind them, one scheduled
    worker = spawn_worker(control_plane, threads=2)
    ended = wait_done(control_plane, submit(control_plane, "noop", labels={"batch": "7"}).id)
    assert ended.state == S.SUCCEEDED
    batch = submit_many(
        control_plane,
        [
            *[request("sleep", {"seconds": 60}, labels={"batch": "7"}) for _ in range(4)],
            request("noop", labels={"batch": "7"}, scheduled_at=seconds_from_now(3600)),
        ],
    )
    # and batch 8's scheduled job
    other = submit(control_plane, "noop", labels={"batch": "8"}, scheduled_at=seconds_from_now(3600))
    running = batch[:2]
    wait_until(lambda: all(control_plane.get(j.id).state == S.RUNNING for j in running), what="two sleeps to run")
    # When batch 7 is cancelled in one call
    answer = _cancel(control_plane, labels={"batch": "7"})
    # Then its five unfinished jobs are cancelled, oldest first, and none is left over
    assert (list(answer.ids), answer.remaining) == ([j.id for j in batch], 0)
    for job in batch:
        assert control_plane.get(job.id).state == S.CANCELLED
    # the queued and scheduled ones never ran
    assert [control_plane.get(j.id).attempts for j in batch[2:]] == [0, 0, 0]
    # the running ones' processes were killed: both slots take new jobs long before the sleeps would end
    quick = submit_many(control_plane, [request("noop"), request("noop")])
    assert {wait_done(control_plane, j.id, timeout=15).worker_id for j in quick} == {worker.worker_id}
    # and what was not of batch 7, or had ended, is as it was
    assert control_plane.get(ended.id).state == S.SUCCEEDED
    assert control_plane.get(other.id).state == S.SCHEDULED
    # A second call finds nothing left to cancel
    again = _cancel(control_plane, labels={"batch": "7"})
    assert (list(again.ids), again.remaining) == ([], 0)
    # and the metrics count each job cancelled, by type
    metrics = scrape(Rest(http_port(control_plane)))
    assert metrics['corral_jobs_cancelled_total{type="sleep"}'] == 4
    assert metrics['corral_jobs_cancelled_total{type="noop"}'] == 1


def test_a_limit_takes_the_oldest_and_the_answer_says_how_many_more_matched(control_plane: ControlProc) -> None:
    # Given 25 queued noop jobs, 5 queued sleeps and 3 scheduled noops (no worker: nothing runs)
    noops = submit_many(control_plane, [request("noop") for _ in range(25)])
    sleeps = submit_many(control_plane, [request("sleep", {"seconds": 1}) for _ in range(5)])
    later = submit_many(control_plane, [request("noop", scheduled_at=seconds_from_now(3600)) for _ in range(3)])
    # When the noop jobs are cancelled 10 at a time
    first = _cancel(control_plane, type="noop", status=[S.PENDING], limit=10)
    # Then the 10 oldest go, and the answer says 15 more matched
    assert (list(first.ids), first.remaining) == ([j.id for j in noops[:10]], 15)
    second = _cancel(control_plane, type="noop", status=[S.PENDING], limit=10)
    assert (list(second.ids), second.remaining) == ([j.id for j in noops[10:20]], 5)
    # A state filter leaves the others: only the scheduled ones
    scheduled = _cancel(control_plane, status=[S.SCHEDULED])
    assert (list(scheduled.ids), scheduled.remaining) == ([j.id for j in later], 0)
    # Named ids narrow with the rest (a finished one among them is left as it is)
    named = _cancel(control_plane, ids=[sleeps[1].id, noops[0].id, noops[24].id], type="sleep")
    assert list(named.ids) == [sleeps[1].id]
    # and `all` takes every unfinished job
    rest = _cancel(control_plane, all=True)
    assert list(rest.ids) == [j.id for j in (*noops[20:], sleeps[0], *sleeps[2:])]
    assert control_plane.jobs.GetStats(jobs_pb2.GetStatsRequest()).jobs_by_status["CANCELLED"] == 33


def test_a_cancel_of_thousands_goes_in_chunks_and_cancels_every_one(control_plane: ControlProc) -> None:
    # Given 2,500 queued jobs (three of the control plane's 1,000-job transactions)
    ids = [j.id for j in submit_many(control_plane, [request("noop") for _ in range(2_500)])]
    # When they are cancelled in one call, Then every one is, oldest first, and all are committed
    answer = _cancel(control_plane, type="noop")
    assert (list(answer.ids), answer.remaining) == (ids, 0)
    stats = control_plane.jobs.GetStats(jobs_pb2.GetStatsRequest())
    assert (stats.jobs_by_status["CANCELLED"], stats.jobs_by_status["PENDING"]) == (2_500, 0)
    listed = control_plane.jobs.ListJobs(jobs_pb2.ListJobsRequest(status=[S.CANCELLED], limit=1))
    assert listed.total == 2_500


def test_what_the_answer_names_is_committed_kill_9_right_after_loses_none(
    control_plane: ControlProc, spawn_worker: Callable[..., WorkerProc]
) -> None:
    # Given 3,000 queued jobs (no worker yet)
    ids = [j.id for j in submit_many(control_plane, [request("noop", labels={"b": "1"}) for _ in range(3_000)])]
    # When they are cancelled and the control plane is killed the moment the answer arrives
    answer = _cancel(control_plane, labels={"b": "1"})
    control_plane.kill()
    control_plane.start()
    # Then after the restart every one the answer named is CANCELLED, and none runs on a worker
    assert list(answer.ids) == ids
    spawn_worker(control_plane, threads=2)
    probe = wait_done(control_plane, submit(control_plane, "noop").id)  # the worker takes jobs
    assert probe.state == S.SUCCEEDED
    stats = control_plane.jobs.GetStats(jobs_pb2.GetStatsRequest())
    assert (stats.jobs_by_status["CANCELLED"], stats.jobs_by_status["SUCCEEDED"]) == (3_000, 1)


def test_what_waits_on_a_cancelled_job_is_cancelled_in_turn(control_plane: ControlProc) -> None:
    # Given a queued job and two that wait on it
    first = submit(control_plane, "noop")
    second = submit(control_plane, "noop", depends_on=[first.id])
    third = submit(control_plane, "noop", depends_on=[second.id])
    # When only the first is cancelled by id
    answer = _cancel(control_plane, ids=[first.id])
    # Then the two waiting on it are cancelled in turn, saying why
    assert list(answer.ids) == [first.id]
    for job in (second, third):
        done = wait_done(control_plane, job.id)
        assert (done.state, done.error.code) == (S.CANCELLED, "DEPENDENCY_FAILED")


def test_bad_requests_are_refused_naming_the_field_and_change_nothing(control_plane: ControlProc) -> None:
    queued = submit(control_plane, "noop", labels={"batch": "1"})
    refusals: list[tuple[dict[str, Any], str]] = [
        ({}, "all: must be true to cancel every unfinished job"),
        ({"status": [S.SUCCEEDED]}, "status[0]: SUCCEEDED jobs have ended"),
        ({"status": [42]}, "status[0]: unknown state 42"),
        ({"all": True, "limit": -1}, "limit: must be between 1 and 10,000, got -1"),
        ({"all": True, "limit": 10_001}, "limit: must be between 1 and 10,000, got 10001"),
        ({"ids": [queued.id, queued.id]}, "ids[1]: repeats ids[0]"),
        ({"ids": [""]}, "ids[0]: is required"),
        ({"type": "t" * 500}, "type: "),
        ({"labels": {"": "x"}}, "labels"),
    ]
    for fields, message in refusals:
        err = rpc_error(_cancel, control_plane, **fields)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details().startswith(message), (fields, err)
    # An id that names no job is NOT_FOUND, and the job named beside it is not cancelled
    missing = rpc_error(_cancel, control_plane, ids=[queued.id, "no-such-job"])
    assert (missing.code(), missing.details()) == (grpc.StatusCode.NOT_FOUND, "job 'no-such-job' not found")
    assert control_plane.get(queued.id).state == S.PENDING
    # Over REST the same rules, and JSON of the wrong types names the field
    rest = Rest(http_port(control_plane))
    for body, field in (
        ({"all": "yes"}, "all"),
        ({"ids": queued.id}, "ids"),
        ({"limit": "ten", "all": True}, "limit"),
        ({"labels": {"batch": 1}}, "labels"),
        ({"everything": True}, "everything"),
        ({}, "all"),
    ):
        reply = rest.post("/v1/jobs:cancelMany", body)
        assert reply.status == 400 and field in reply.violation(), (body, reply.body)
    malformed = rest.call("POST", "/v1/jobs:cancelMany", raw=b'{"all": tru')
    assert malformed.status == 400
    assert control_plane.get(queued.id).state == S.PENDING
    # and a good one answers the ids as JSON
    reply = rest.post("/v1/jobs:cancelMany", {"labels": {"batch": "1"}, "limit": 5})
    assert reply.status == 200 and json.loads(reply.body) == {"ids": [queued.id], "remaining": "0"}


def test_the_python_clients_and_the_cli(control_plane: ControlProc) -> None:
    jobs = submit_many(control_plane, [request("noop", labels={"team": "edge"}) for _ in range(5)])
    ids = [j.id for j in jobs]
    with corral.Client(control_plane.address) as client:
        first = client.cancel_many(labels={"team": "edge"}, status=["pending"], limit=2)
        assert first == corral.Changed(ids[:2], 3)
        # the client checks ids as the control plane does, before sending
        with pytest.raises(InvalidArgument, match="ids: must be a list of job ids, got str"):
            client.cancel_many(ids[2])  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match=r"^all: must be true"):
            client.cancel_many()
        with pytest.raises(NotFound):
            client.cancel_many(["no-such-job"])

    async def cancel_one() -> corral.Changed:
        async with corral.AsyncClient(control_plane.address) as aclient:
            return await aclient.cancel_many([ids[2]])

    assert asyncio.run(cancel_one()) == corral.Changed([ids[2]], 0)
    # `corral cancel` with a filter, 1 at a time: it calls again until none is left
    out = cli.corral("cancel", "--control", control_plane.address, "--label", "team=edge", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"cancelled": ids[3:], "remaining": 0}
    # with nothing to narrow it, it asks for --all, and changes nothing
    queued = submit(control_plane, "noop")
    refused = cli.corral("cancel", "--control", control_plane.address)
    assert refused.returncode != 0 and "field 'all': must be true" in refused.stderr
    assert control_plane.get(queued.id).state == S.PENDING
    everything = cli.corral("cancel", "--control", control_plane.address, "--all")
    assert everything.returncode == 0 and "Cancelled 1 job" in everything.stdout, everything.stderr


def test_a_client_cancels_only_what_it_may_see_and_each_job_is_audited(tenants: Tenants) -> None:  # noqa: F811
    with tenants.client("alice") as alice, tenants.client("bob") as bob, tenants.client("ops") as ops:
        alices = [alice.submit("sleep", {"seconds": 60}) for _ in range(3)]
        bobs = [bob.submit("sleep", {"seconds": 60}) for _ in range(2)]
        # When bob cancels everything he can, Then only his jobs go
        assert bob.cancel_many(all=True) == corral.Changed([j.id for j in bobs], 0)
        assert {alice.get(j.id).state.name for j in alices} <= {"PENDING", "RUNNING"}
        # naming alice's job is NOT_FOUND, as a missing one is, and asking for her jobs finds none
        with pytest.raises(NotFound, match=alices[0].id):
            bob.cancel_many([alices[0].id])
        assert bob.cancel_many(owner="alice") == corral.Changed([], 0)
        # while the admin cancels alice's by owner
        assert ops.cancel_many(owner="alice", limit=2) == corral.Changed([j.id for j in alices[:2]], 1)
        page = ops.audit(action="job.cancel")
    # Then the audit log has one event per job cancelled (newest first), and the refusal
    assert _events(page) == [
        *[("ops", "job.cancel", j.id, "OK") for j in reversed(alices[:2])],
        ("bob", "job.cancel", "jobs: 1 ids", "NOT_FOUND"),
        *[("bob", "job.cancel", j.id, "OK") for j in reversed(bobs)],
    ]
