"""Idempotency keys against a real control plane on 127.0.0.1: concurrent duplicates make one job
and get one answer (gRPC and REST, SubmitJob and SubmitJobs), a key reused for another request is
ALREADY_EXISTS / 409 and stores nothing, a duplicate after completion gets the finished job, keys
survive a restart, and an expired key makes a new job."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from corral.v1 import jobs_pb2, jobs_pb2_grpc
from tests.conftest import ControlProc, wait_until
from tests.integration.test_health_metrics import scrape
from tests.integration.test_rest import Rest
from tests.support.calls import request, rpc_error, submit, wait_done

CONCURRENT = 50
REPLAYS = "corral_idempotent_replays_total"


def total(cp: ControlProc) -> int:
    page: jobs_pb2.ListJobsResponse = cp.jobs.ListJobs(jobs_pb2.ListJobsRequest(limit=1), timeout=10)
    return page.total


def stored_keys(db: Path) -> dict[str, str]:
    """key -> job id of the idempotency keys in the control plane's database (read beside it: WAL), each
    key as its client sent it (the store keeps it with its owner, none here: ``:key``)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT key, job_id FROM idempotency_keys").fetchall()
    assert all(key.startswith(":") for key, _ in rows), rows
    return {key[1:]: job_id for key, job_id in rows}


async def submit_concurrently(cp: ControlProc, calls: list[Any]) -> list[bytes]:
    """Run ``calls`` (functions of a JobService stub returning an awaitable) at once on one channel;
    returns every job of every answer, serialised (deterministic), in call order."""
    async with grpc.aio.insecure_channel(cp.address) as channel:
        stub = jobs_pb2_grpc.JobServiceStub(channel)
        answers = await asyncio.gather(*(call(stub) for call in calls))
    out: list[bytes] = []
    for answer in answers:
        jobs = [answer.job] if isinstance(answer, jobs_pb2.SubmitJobResponse) else list(answer.jobs)
        out.extend(j.SerializeToString(deterministic=True) for j in jobs)
    return out


def test_50_concurrent_identical_grpc_submits_make_one_job_and_50_identical_answers(
    control_plane: ControlProc,
) -> None:
    # Given no worker (so the job stays as it was made while the answers go out) and a fresh key
    rest = Rest(control_plane.http_port)
    before = scrape(rest)[REPLAYS]
    req = request("add_numbers", {"a": 1, "b": 2}, name="once", idempotency_key=f"k-{uuid.uuid4().hex}")

    # When 50 identical SubmitJob calls are in flight at once
    answers = asyncio.run(submit_concurrently(control_plane, [lambda s: s.SubmitJob(req, timeout=30)] * CONCURRENT))

    # Then there is one job, every answer is byte-for-byte the same, and 49 count as replays
    assert len(answers) == CONCURRENT and len(set(answers)) == 1
    job = jobs_pb2.Job.FromString(answers[0])
    assert total(control_plane) == 1 and job.idempotency_key == req.idempotency_key
    assert scrape(rest)[REPLAYS] - before == CONCURRENT - 1


def test_duplicates_across_submit_job_and_batches_make_one_job(control_plane: ControlProc) -> None:
    # Given one request, sent alone with the key in metadata and inside batches with the key in the field
    key = f"k-{uuid.uuid4().hex}"
    alone = request("noop", name="mixed")
    in_batch = request("noop", name="mixed", idempotency_key=key)
    batch = jobs_pb2.SubmitJobsRequest(jobs=[in_batch, request("noop", name="other"), in_batch, in_batch])
    calls = [lambda s: s.SubmitJob(alone, metadata=(("idempotency-key", key),), timeout=30)] * 20
    calls += [lambda s: s.SubmitJobs(batch, timeout=30)] * 10

    # When all of them run at once
    answers = asyncio.run(submit_concurrently(control_plane, calls))

    # Then every answer for the key is one job; the batches' other job is one job per batch
    jobs = [jobs_pb2.Job.FromString(a) for a in answers]
    keyed = {j.id for j in jobs if j.name == "mixed"}
    others = {j.id for j in jobs if j.name == "other"}
    assert len(keyed) == 1 and len(others) == 10
    assert total(control_plane) == 11


def test_a_batch_with_a_key_for_the_whole_call_is_refused_naming_where_keys_go(control_plane: ControlProc) -> None:
    # The call's key was ignored, so a batch sent again after a lost answer made every job twice.
    batch = jobs_pb2.SubmitJobsRequest(jobs=[request("noop"), request("noop")])
    err = rpc_error(control_plane.jobs.SubmitJobs, batch, metadata=(("idempotency-key", "k-batch"),), timeout=10)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "idempotency-key" in err.details() and "jobs[i].idempotency_key" in err.details()

    # REST: the header on :batchSubmit is a 400 naming it, as grpc-gateway would pass it on as metadata
    rest = Rest(control_plane.http_port)
    for header in ("X-Idempotency-Key", "Idempotency-Key"):
        reply = rest.post("/v1/jobs:batchSubmit", {"jobs": [{"type": "noop"}]}, headers={header: "k-batch"})
        assert reply.status == 400 and reply.violation() == "idempotency-key", reply.body
    assert total(control_plane) == 0

    # Keys in the jobs themselves still work
    keyed = jobs_pb2.SubmitJobsRequest(jobs=[request("noop", idempotency_key="k-1")])
    first = control_plane.jobs.SubmitJobs(keyed, timeout=10).jobs[0]
    assert control_plane.jobs.SubmitJobs(keyed, timeout=10).jobs[0].id == first.id
    assert total(control_plane) == 1


def test_a_key_in_the_header_or_metadata_that_differs_from_the_field_is_refused(control_plane: ControlProc) -> None:
    # The header (the metadata) was dropped when the body carried another key: a client that retried with
    # the header got a job under the field's key, and a second job when the field changed.
    rest = Rest(control_plane.http_port)
    body = {"type": "noop", "idempotencyKey": "other"}
    for header in ("Idempotency-Key", "X-Idempotency-Key"):
        reply = rest.post("/v1/jobs", body, headers={header: "k1"})
        assert reply.status == 400 and reply.violation() == "idempotency_key", reply.body
        assert "differs from the" in reply.json()["message"] and header in reply.json()["message"]
    run = rest.post("/v1/jobs:run", body, headers={"Idempotency-Key": '"k1"'})
    (line,) = run.lines()
    assert run.status == 400 and line["error"]["details"][0]["fieldViolations"][0]["field"] == "idempotency_key"
    mismatched = request("noop", idempotency_key="other")
    for call in (control_plane.jobs.SubmitJob, lambda *a, **kw: next(control_plane.jobs.RunJob(*a, **kw))):
        err = rpc_error(call, mismatched, metadata=(("idempotency-key", "k1"),), timeout=10)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert err.details().startswith("idempotency_key: differs from the") and "'k1'" in err.details()
    assert total(control_plane) == 0

    # The same key in both is one key
    first = rest.submit({"type": "noop", "idempotencyKey": "k1"}, headers={"Idempotency-Key": '"k1"'})
    assert rest.submit({"type": "noop"}, headers={"X-Idempotency-Key": "k1"})["id"] == first["id"]
    same_key = request("noop", idempotency_key="k1")
    metadata = (("idempotency-key", "k1"),)
    assert control_plane.jobs.SubmitJob(same_key, metadata=metadata, timeout=10).job.id == first["id"]
    stream = control_plane.jobs.RunJob(same_key, metadata=metadata, timeout=10)
    assert next(stream).job.id == first["id"]  # no worker: the job waits, so the stream is ended here
    stream.cancel()
    assert total(control_plane) == 1


def test_50_concurrent_identical_rest_submits_make_one_job_and_50_identical_answers(
    control_plane: ControlProc,
) -> None:
    rest = Rest(control_plane.http_port)
    before = scrape(rest)[REPLAYS]
    key = f"order-{uuid.uuid4().hex}"
    body = {"type": "add_numbers", "payload": {"a": 2, "b": 3}, "priority": 5}

    # When 50 clients POST the same body with the same X-Idempotency-Key at once
    with ThreadPoolExecutor(CONCURRENT) as pool:
        replies = list(
            pool.map(lambda _: rest.post("/v1/jobs", body, headers={"X-Idempotency-Key": key}), range(CONCURRENT))
        )

    # Then all are 200 with the same job, and one job exists
    assert [r.status for r in replies] == [200] * CONCURRENT
    assert len({json.dumps(r.json(), sort_keys=True) for r in replies}) == 1
    assert replies[0].json()["job"]["idempotencyKey"] == key
    assert total(control_plane) == 1
    assert scrape(rest)[REPLAYS] - before == CONCURRENT - 1


def test_same_key_with_another_request_is_already_exists_and_stores_nothing(control_plane: ControlProc) -> None:
    key = f"k-{uuid.uuid4().hex}"
    first = submit(control_plane, "add_numbers", {"a": 1, "b": 2}, idempotency_key=key)

    # gRPC: ALREADY_EXISTS, and the message says why and names the job the key belongs to
    err = rpc_error(
        control_plane.jobs.SubmitJob, request("add_numbers", {"a": 1, "b": 3}, idempotency_key=key), timeout=10
    )
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "already used for a different request" in err.details() and first.id in err.details()

    # REST: 409 with the same message, whether the key comes as the header or the field
    rest = Rest(control_plane.http_port)
    clash = rest.post("/v1/jobs", {"type": "noop"}, headers={"X-Idempotency-Key": key})
    assert clash.status == 409 and "already used for a different request" in clash.json()["message"]
    clash = rest.post("/v1/jobs", {"type": "noop", "idempotencyKey": key})
    assert clash.status == 409 and "already used for a different request" in clash.json()["message"]

    # A batch that reuses a key for two different requests is refused whole
    fresh = f"k-{uuid.uuid4().hex}"
    batch = jobs_pb2.SubmitJobsRequest(
        jobs=[request("noop", idempotency_key=fresh), request("noop", name="x", idempotency_key=fresh)]
    )
    err = rpc_error(control_plane.jobs.SubmitJobs, batch, timeout=10)
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS and "jobs[1].idempotency_key" in err.details()
    assert total(control_plane) == 1

    # and reserves nothing: the key it refused still makes a job
    made = submit(control_plane, "noop", name="x", idempotency_key=fresh)
    assert control_plane.get(made.id).id == made.id and total(control_plane) == 2


def test_duplicate_after_completion_returns_the_finished_job_with_its_result(
    control_plane: ControlProc, spawn_worker: Any
) -> None:
    spawn_worker(control_plane, imports=())
    key = f"k-{uuid.uuid4().hex}"
    job = submit(control_plane, "add_numbers", {"a": 20, "b": 22}, idempotency_key=key)
    done = wait_done(control_plane, job.id)
    assert done.state == jobs_pb2.Job.SUCCEEDED

    again = submit(control_plane, "add_numbers", {"a": 20, "b": 22}, idempotency_key=key)
    assert again == done and again.result["sum"] == 42
    rest = Rest(control_plane.http_port)
    over_rest = rest.submit({"type": "add_numbers", "payload": {"a": 20, "b": 22}}, headers={"X-Idempotency-Key": key})
    assert over_rest["id"] == job.id and over_rest["state"] == "SUCCEEDED" and over_rest["result"] == {"sum": 42}
    assert total(control_plane) == 1


def test_keys_survive_a_control_plane_restart(control_plane: ControlProc) -> None:
    key = f"k-{uuid.uuid4().hex}"
    first = submit(control_plane, "noop", name="durable", idempotency_key=key)

    # When the control plane restarts (same ports, same database)
    assert control_plane.stop() == 0
    control_plane.start()

    # Then the key still maps to the job, and still refuses another request
    assert submit(control_plane, "noop", name="durable", idempotency_key=key).id == first.id
    err = rpc_error(control_plane.jobs.SubmitJob, request("noop", name="other", idempotency_key=key), timeout=10)
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS
    assert total(control_plane) == 1


@pytest.mark.parametrize("ttl", ["3"])
def test_an_expired_key_is_swept_and_makes_a_new_job(make_control_plane: Any, ttl: str) -> None:
    cp: ControlProc = make_control_plane(IDEMPOTENCY_TTL_SEC=ttl)
    key = f"k-{uuid.uuid4().hex}"
    first = submit(cp, "noop", idempotency_key=key)
    assert stored_keys(cp.db) == {key: first.id}

    # When the TTL passes, the sweep deletes the key from the store
    wait_until(lambda: key not in stored_keys(cp.db), timeout=15, what="the expired key to be swept")

    # Then the key makes a new job (even for another request), which it now maps to
    second = submit(cp, "noop", name="another", idempotency_key=key)
    assert second.id != first.id and total(cp) == 2
    assert submit(cp, "noop", name="another", idempotency_key=key).id == second.id
    assert stored_keys(cp.db) == {key: second.id}


def test_a_key_that_outlived_its_job_makes_a_new_job_instead_of_not_found(
    make_control_plane: Any, spawn_worker: Any
) -> None:
    # Given a keyed job that finished while keys lived an hour
    cp: ControlProc = make_control_plane(IDEMPOTENCY_TTL_SEC="3600")
    spawn_worker(cp)
    first = submit(cp, "noop", idempotency_key="nightly")
    assert wait_done(cp, first.id).state == jobs_pb2.Job.SUCCEEDED
    # When the TTL and retention are lowered to a second, so that retention purges the job while its key,
    # made under the old TTL, still lives
    assert cp.stop() == 0
    cp.env.update(IDEMPOTENCY_TTL_SEC="1", CORRAL_JOB_RETENTION_SEC="1")
    cp.start()

    def gone() -> bool:
        try:
            cp.jobs.GetJob(jobs_pb2.GetJobRequest(id=first.id), timeout=10)
        except grpc.RpcError as err:
            return bool(err.code() == grpc.StatusCode.NOT_FOUND)
        return False

    wait_until(gone, timeout=15, what="the finished job to be purged")
    assert "nightly" in stored_keys(cp.db)
    # Then the key sent again makes a new job (as an expired key does), not a NOT_FOUND for the old one
    again = submit(cp, "noop", idempotency_key="nightly")
    assert again.id != first.id
    assert submit(cp, "noop", idempotency_key="nightly").id == again.id
    assert [e["job_id"] for e in cp.events("idempotency_key_outlived_job")] == [first.id]


def test_a_time_comes_back_as_sent_and_a_request_rebuilt_from_the_answer_replays_its_key(
    control_plane: ControlProc,
) -> None:
    # Given a keyed job scheduled at a time with milliseconds, over REST and over gRPC
    rest = Rest(control_plane.http_port)
    sent = {"type": "noop", "scheduledAt": "2030-01-01T00:00:00.123Z", "idempotencyKey": "at-123"}
    job = rest.submit(sent)
    # Then the time comes back as it was sent, not with the float's error (.123000064Z)
    assert job["scheduledAt"] == "2030-01-01T00:00:00.123Z"
    # and a request rebuilt from the answer, the time as shown, is the same request: its key replays
    again = request("noop", idempotency_key="at-123")
    again.scheduled_at.CopyFrom(
        control_plane.jobs.GetJob(jobs_pb2.GetJobRequest(id=job["id"]), timeout=10).scheduled_at
    )
    assert again.scheduled_at.nanos == 123_000_000
    assert control_plane.jobs.SubmitJob(again, timeout=10).job.id == job["id"]
    assert total(control_plane) == 1


@pytest.mark.parametrize("header", ["Idempotency-Key", "X-Idempotency-Key"])
@pytest.mark.parametrize("value", ["", '""'])
def test_an_empty_key_header_is_refused_not_taken_as_no_key(
    control_plane: ControlProc, header: str, value: str
) -> None:
    # A client that means to send a key and sends it empty would make a job its retry makes again
    reply = Rest(control_plane.http_port).post("/v1/jobs", {"type": "noop"}, headers={header: value})
    assert reply.status == 400, reply.body
    assert reply.json()["message"].startswith(f"{header}: is empty"), reply.json()
    assert total(control_plane) == 0
