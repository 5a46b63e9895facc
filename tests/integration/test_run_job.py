"""RunJob: one call that submits a job and streams it to its end, over gRPC, REST and both clients.

Against a real control plane and worker on 127.0.0.1: the stream starts with the job as committed,
ends at its terminal state, stores the job once (an idempotency key included), and leaves the job
running when the caller goes away. Bad input is refused as SubmitJob refuses it (test_bad_input).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import corral
from corral import JobState
from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, wait_until
from tests.integration.test_rest import BAD_REQUEST, Rest
from tests.support import cli
from tests.support.calls import TERMINAL, request, stored


@pytest.fixture
def served(control_plane: ControlProc, spawn_worker: Any) -> ControlProc:
    spawn_worker(control_plane, threads=2, imports=())  # the built-in job types only
    return control_plane


def test_the_stream_starts_at_the_committed_job_and_ends_at_its_result(served: ControlProc) -> None:
    # When a job is run in one call
    events = [e.job for e in served.jobs.RunJob(request("add_numbers", {"a": 2, "b": 40}, name="answer"), timeout=30)]

    # Then the first event is the job as stored, the last its end, and no state comes twice
    first, last = events[0], events[-1]
    assert first.state in (jobs_pb2.Job.PENDING, jobs_pb2.Job.RUNNING) and first.name == "answer"
    assert {e.id for e in events} == {first.id}
    assert last.state == jobs_pb2.Job.SUCCEEDED and last.attempts == 1 and last.worker_id
    assert dict(last.result) == {"sum": 42}
    assert all(e.state not in TERMINAL for e in events[:-1])
    assert len({e.state for e in events}) == len(events), [jobs_pb2.Job.State.Name(e.state) for e in events]
    # and it is the job GetJob answers, stored once
    assert served.get(first.id) == last
    assert stored(served) == 1


def test_a_repeated_idempotency_key_streams_the_first_job(served: ControlProc) -> None:
    key = (("idempotency-key", "run-once"),)
    first = list(served.jobs.RunJob(request("noop"), timeout=30, metadata=key))[-1].job
    again = [e.job for e in served.jobs.RunJob(request("noop"), timeout=30, metadata=key)]
    assert [j.id for j in again] == [first.id] and again[0] == served.get(first.id)
    assert again[0].state == jobs_pb2.Job.SUCCEEDED and stored(served) == 1


def test_a_job_that_fails_ends_the_stream_failed(served: ControlProc) -> None:
    req = request("sleep", {"seconds": 30}, timeout_sec=1, max_attempts=1)
    last = list(served.jobs.RunJob(req, timeout=30))[-1].job
    assert last.state == jobs_pb2.Job.FAILED and last.error.code == "TIMEOUT"


def test_a_caller_that_goes_away_leaves_the_job_running(served: ControlProc) -> None:
    # Given a long job run in one call, whose caller hangs up after the first event
    call = served.jobs.RunJob(request("sleep", {"seconds": 1}), timeout=30)
    job_id = next(call).job.id
    call.cancel()

    # Then the job still runs to its end, once
    wait_until(lambda: served.get(job_id).state in TERMINAL, 30, what="the job to end")
    done = served.get(job_id)
    assert done.state == jobs_pb2.Job.SUCCEEDED and done.attempts == 1
    assert stored(served) == 1


def test_rest_streams_the_run_as_newline_delimited_json(served: ControlProc) -> None:
    rest = Rest(served.http_port)
    reply = rest.post("/v1/jobs:run", {"type": "reverse_string", "payload": {"text": "héllo"}})
    assert reply.status == 200, reply.body
    assert reply.headers["Content-Type"] == "application/x-ndjson"
    jobs = [line["result"]["job"] for line in reply.lines()]
    assert jobs[-1]["state"] == "SUCCEEDED" and jobs[-1]["result"] == {"reversed": "olléh"}
    assert {j["id"] for j in jobs} == {jobs[0]["id"]}

    # Bad input gets the error's own HTTP status before any stream starts, naming the field, and nothing
    # is stored. As with grpc-gateway, a body that does not parse is answered as any call's error is, and
    # a submission the call refuses as the stream's one line, {"error": status}.
    for body, field in (({"type": "noop", "priority": "high"}, "priority"), ({"type": "nope"}, "type")):
        bad = rest.post("/v1/jobs:run", body)
        (line,) = bad.lines()
        status = line["error"] if field == "type" else line
        (detail,) = [d for d in status["details"] if d["@type"] == BAD_REQUEST]
        assert bad.status == 400 and detail["fieldViolations"][0]["field"] == field, bad.body
    malformed = rest.call("POST", "/v1/jobs:run", raw=b'{"type": "noop",')
    assert malformed.status == 400, malformed.body
    assert stored(served) == 1

    # The Idempotency-Key header works as on POST /v1/jobs: the same key streams the same job
    keyed = [rest.post("/v1/jobs:run", {"type": "noop"}, headers={"Idempotency-Key": '"run-7"'}) for _ in range(2)]
    first, again = ([line["result"]["job"] for line in r.lines()] for r in keyed)
    assert again[-1]["id"] == first[-1]["id"] and again[-1]["state"] == "SUCCEEDED"
    assert stored(served) == 2


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_the_clients_run_a_job_and_return_its_end(served: ControlProc, kind: str) -> None:
    def run(*args: Any, **kwargs: Any) -> corral.Job:
        if kind == "sync":
            with corral.Client(served.address, timeout=10) as client:
                return client.run(*args, **kwargs)

        async def go() -> corral.Job:
            async with corral.AsyncClient(served.address, timeout=10) as client:
                return await client.run(*args, **kwargs)

        return asyncio.run(go())

    done = run("add_numbers", {"a": 1, "b": 2}, labels={"via": kind}, timeout=30)
    assert done.state is JobState.SUCCEEDED and done.result == {"sum": 3} and done.labels == {"via": kind}

    # A field the request cannot carry is refused before anything is sent
    with pytest.raises(corral.InvalidArgument) as bad:
        run("noop", priority=1000)
    assert bad.value.field == "priority"

    # The wait's own limit raises DeadlineExceeded; the job goes on
    started = time.monotonic()
    with pytest.raises(corral.DeadlineExceeded):
        run("sleep", {"seconds": 2}, timeout=0.5)
    assert time.monotonic() - started < 2
    assert stored(served) == 2
    wait_until(
        lambda: served.jobs.GetStats(jobs_pb2.GetStatsRequest(), timeout=10).jobs_by_status["SUCCEEDED"] == 2,
        30,
        what="the job whose wait timed out to finish anyway",
    )


def test_corral_submit_wait_runs_the_job_in_one_call(served: ControlProc) -> None:
    done = cli.corral("submit", "add_numbers", "--payload", '{"a": 20, "b": 22}', "--wait", "--control", served.address)
    assert done.returncode == 0, done.stderr
    assert "SUCCEEDED" in done.stdout and "42" in done.stdout

    failed = cli.corral(
        "submit", "sleep", "--payload", '{"seconds": 30}', "--timeout", "1", "--max-attempts", "1", "--wait",
        "--control", served.address,
    )  # fmt: skip
    assert failed.returncode == 1 and "ended FAILED: TIMEOUT" in failed.stderr, failed.stderr
    assert stored(served) == 2
