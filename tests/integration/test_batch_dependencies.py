"""A graph of jobs in one SubmitJobs batch, on a real control plane and real workers: a job names
earlier jobs of its batch by their place in it (``depends_on_index``), runs only after they SUCCEED,
is CANCELLED when one of them fails; the batch is accepted whole or not at all, survives a ``kill -9``
of the control plane once acknowledged, replays by idempotency keys, and bad links are refused naming
the field, over gRPC, REST and the Python client, with nothing stored."""

from __future__ import annotations

import itertools
import time
from typing import Any

import grpc

from corral import Client, JobSpec
from corral.errors import InvalidArgument
from corral.v1 import jobs_pb2
from tests.conftest import ControlProc
from tests.integration.test_rest import Rest, http_port
from tests.support.calls import request, rpc_error, stored, submit_many, wait_all_done, wait_done

S = jobs_pb2.Job


def _ns(ts: Any) -> int:
    return int(ts.ToNanoseconds())


def test_a_diamond_in_one_batch_runs_in_order(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given two workers, and in one batch: A, then B and C after A, then D after B and C, and E on its own
    spawn_worker(control_plane, threads=2)
    spawn_worker(control_plane, threads=2)
    a, b, c, d, e = submit_many(
        control_plane,
        [
            request("sleep", {"seconds": 0.3}),
            request("sleep", {"seconds": 0.2}, depends_on_index=[0]),
            request("sleep", {"seconds": 0.1}, depends_on_index=[0]),
            request("noop", depends_on_index=[1, 2]),
            request("noop"),
        ],
    )
    # Then the answer names each link by id, and says what each job waits for
    assert (list(b.depends_on), list(b.waiting_on), b.state) == ([a.id], [a.id], S.SCHEDULED)
    assert list(c.depends_on) == [a.id]
    assert list(d.depends_on) == [b.id, c.id] and sorted(d.waiting_on) == sorted([b.id, c.id])
    assert list(e.depends_on) == [] and e.state != S.SCHEDULED
    # and each job starts only after every job it names finished
    done = {j.id: j for j in wait_all_done(control_plane, [j.id for j in (a, b, c, d, e)], timeout=30)}
    assert {j.state for j in done.values()} == {S.SUCCEEDED}
    for job, before in ((b, a), (c, a), (d, b), (d, c)):
        assert _ns(done[job.id].started_at) >= _ns(done[before.id].finished_at), (job.id, before.id)
    # B and C, both ready when A ended, ran side by side
    assert _ns(done[c.id].started_at) < _ns(done[b.id].finished_at)
    assert {j.attempts for j in done.values()} == {1}


def test_a_failure_cancels_what_hangs_on_it_in_the_batch(control_plane: ControlProc, spawn_worker: Any) -> None:
    spawn_worker(control_plane, threads=2)
    # Given A that fails its one attempt (and would succeed a second), B after A, C after B and an existing job, and D after nothing
    ok = wait_done(control_plane, submit_many(control_plane, [request("noop")])[0].id)
    a, b, c, d = submit_many(
        control_plane,
        [
            request("failing", {"fail_attempts": 1}, max_attempts=1),
            request("noop", depends_on_index=[0]),
            request("noop", depends_on=[ok.id], depends_on_index=[1]),
            request("noop"),
        ],
    )
    assert list(c.depends_on) == [ok.id, b.id] and list(c.waiting_on) == [b.id]
    # When A fails, B and C are cancelled without running, each naming the job it waited for
    assert wait_done(control_plane, a.id).state == S.FAILED
    for job, cause in ((b, a), (c, b)):
        ended = wait_done(control_plane, job.id)
        assert (ended.state, ended.error.code, ended.attempts) == (S.CANCELLED, "DEPENDENCY_FAILED", 0)
        assert cause.id in ended.error.message
    assert wait_done(control_plane, d.id).state == S.SUCCEEDED
    # and RetryJob on A brings back the chain, which then runs in order, each job once
    control_plane.jobs.RetryJob(jobs_pb2.RetryJobRequest(id=a.id))
    again = {j.id: j for j in wait_all_done(control_plane, [a.id, b.id, c.id], timeout=30)}
    assert {(j.state, j.attempts) for j in (again[b.id], again[c.id])} == {(S.SUCCEEDED, 1)}
    assert _ns(again[b.id].started_at) >= _ns(again[a.id].finished_at)
    assert _ns(again[c.id].started_at) >= _ns(again[b.id].finished_at)


def test_the_graph_survives_a_kill_of_the_control_plane(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given a chain of 20 jobs acknowledged in one batch, with no worker yet
    reqs = [request("noop")] + [request("noop", depends_on_index=[i]) for i in range(19)]
    chain = submit_many(control_plane, reqs)
    # When the control plane is killed and started again
    control_plane.kill()
    control_plane.start()
    # Then every link is still there, and once a worker comes the chain runs in order, each job once
    assert [list(control_plane.get(j.id).waiting_on) for j in chain[1:]] == [[j.id] for j in chain[:-1]]
    spawn_worker(control_plane, threads=2)
    done = wait_all_done(control_plane, [j.id for j in chain], timeout=60)
    assert {(j.state, j.attempts) for j in done} == {(S.SUCCEEDED, 1)}
    for before, after in itertools.pairwise(done):
        assert _ns(after.started_at) >= _ns(before.finished_at)


def test_idempotent_batches_replay_and_reuse_jobs_by_key(control_plane: ControlProc, spawn_worker: Any) -> None:
    spawn_worker(control_plane, threads=2)
    key = f"graph-{time.time_ns()}"
    reqs = [
        request("sleep", {"seconds": 0.2}, idempotency_key=f"{key}-a"),
        request("noop", depends_on_index=[0], idempotency_key=f"{key}-b"),
    ]
    a, b = submit_many(control_plane, reqs)
    total = stored(control_plane)
    # A batch sent again gets the same jobs, and stores nothing
    assert [j.id for j in submit_many(control_plane, reqs)] == [a.id, b.id]
    assert stored(control_plane) == total
    # The same key with other links is another request: refused
    changed = [reqs[0], request("noop", idempotency_key=f"{key}-b")]
    err = rpc_error(control_plane.jobs.SubmitJobs, jobs_pb2.SubmitJobsRequest(jobs=changed))
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS and "jobs[1].idempotency_key" in (err.details() or "")
    # A new job of a batch may hang on a job the batch reuses by its key: while it runs, it waits for it
    reused, c = submit_many(control_plane, [reqs[0], request("noop", depends_on_index=[0])])
    assert reused.id == a.id and list(c.depends_on) == [a.id]
    assert wait_done(control_plane, c.id).state == S.SUCCEEDED
    assert _ns(control_plane.get(c.id).started_at) >= _ns(control_plane.get(a.id).finished_at)
    # once it SUCCEEDED, it runs at once
    reused, d = submit_many(control_plane, [reqs[0], request("noop", depends_on_index=[0])])
    assert reused.id == a.id and list(d.waiting_on) == [] and wait_done(control_plane, d.id).state == S.SUCCEEDED
    # A reused job that FAILED could never let its dependent start: the batch is refused, nothing stored
    failed_key = f"{key}-f"
    (f,) = submit_many(control_plane, [request("failing", {}, max_attempts=1, idempotency_key=failed_key)])
    assert wait_done(control_plane, f.id).state == S.FAILED
    total = stored(control_plane)
    again = [request("failing", {}, max_attempts=1, idempotency_key=failed_key), request("noop", depends_on_index=[0])]
    err = rpc_error(control_plane.jobs.SubmitJobs, jobs_pb2.SubmitJobsRequest(jobs=again))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err.details()
    assert f"jobs[0]: its idempotency key names job {f.id!r}, which is FAILED" in (err.details() or "")
    assert stored(control_plane) == total


def test_bad_links_are_refused_naming_the_field(control_plane: ControlProc) -> None:
    total = stored(control_plane)
    noop = request("noop")
    for jobs, field, rule in (
        ([request("noop", depends_on_index=[0])], "jobs[0].depends_on_index[0]", "none: this is the batch's first"),
        ([noop, request("noop", depends_on_index=[1])], "jobs[1].depends_on_index[0]", "(0..0), got 1"),
        ([noop, noop, request("noop", depends_on_index=[5])], "jobs[2].depends_on_index[0]", "(0..1), got 5"),
        ([noop, request("noop", depends_on_index=[-1])], "jobs[1].depends_on_index[0]", "got -1"),
        ([noop, request("noop", depends_on_index=[0, 0])], "jobs[1].depends_on_index[1]", "repeats 0"),
        (
            [noop] * 2 + [request("noop", depends_on=[f"{i:032x}" for i in range(63)], depends_on_index=[0, 1])],
            "jobs[2].depends_on_index",
            "at most 64 jobs with depends_on, got 65",
        ),
    ):
        err = rpc_error(control_plane.jobs.SubmitJobs, jobs_pb2.SubmitJobsRequest(jobs=jobs))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert f"{field}: " in (err.details() or "") and rule in (err.details() or ""), err.details()
    # Outside a batch there is nothing to point into
    err = rpc_error(control_plane.jobs.SubmitJob, request("noop", depends_on_index=[0]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.details() or "").startswith("depends_on_index: only in a SubmitJobs batch")
    # Over REST, wrong JSON types are named too
    rest = Rest(http_port(control_plane))
    for body, field in (
        ({"jobs": [{"type": "noop"}, {"type": "noop", "dependsOnIndex": ["first"]}]}, "jobs[1].depends_on_index"),
        ({"jobs": [{"type": "noop"}, {"type": "noop", "dependsOnIndex": 0}]}, "jobs[1].depends_on_index"),
        ({"jobs": [{"type": "noop", "depends_on_index": [0]}]}, "jobs[0].depends_on_index[0]"),
    ):
        reply = rest.post("/v1/jobs:batchSubmit", body)
        assert reply.status == 400 and (reply.violation() or "").startswith(field), reply.body
    assert stored(control_plane) == total


def test_the_python_client_sends_a_graph(control_plane: ControlProc, spawn_worker: Any) -> None:
    spawn_worker(control_plane, threads=2)
    with Client(control_plane.address) as client:
        first, second = client.submit_many(
            [JobSpec("noop"), JobSpec("add_numbers", {"a": 1, "b": 2}, depends_on_index=[0])]
        )
        assert second.depends_on == [first.id]
        assert client.wait(second.id, timeout=30).state.name == "SUCCEEDED"
        try:
            client.submit_many([JobSpec("noop"), JobSpec("noop", depends_on_index=["0"])])  # type: ignore[list-item]
        except InvalidArgument as exc:
            assert exc.field == "jobs[1].depends_on_index[0]"
        else:
            raise AssertionError("a string index was sent")
