"""The queue view (ListJobs with order QUEUE, ``Client.queue``, ``corral queue``, ``GET /v1/jobs?order=QUEUE``)
against a real control plane and worker: it lists PENDING jobs in the order they then really start."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import grpc

import corral
from corral.v1 import jobs_pb2
from tests.conftest import ROOT, ControlProc, wait_until
from tests.integration.test_rest import Rest
from tests.support.calls import request, rpc_error, submit, submit_many, wait_all_done

S = jobs_pb2.Job
QUEUE = jobs_pb2.ListJobsRequest.QUEUE


def queue(cp: ControlProc, **fields: Any) -> jobs_pb2.ListJobsResponse:
    response: jobs_pb2.ListJobsResponse = cp.jobs.ListJobs(jobs_pb2.ListJobsRequest(order=QUEUE, **fields), timeout=10)
    return response


def test_the_queue_lists_pending_jobs_in_the_order_they_then_start(
    control_plane: ControlProc, spawn_worker: Any
) -> None:
    # Given the only worker busy with a job that started (so the queue has a drain rate)
    spawn_worker(control_plane, threads=1)
    blocker = submit(control_plane, "sleep", {"seconds": 60})
    wait_until(lambda: control_plane.get(blocker.id).state == S.RUNNING, what="blocker to run")
    # When jobs of two types and mixed priorities queue behind it
    prios = [0, 50, 10, 50, 100, 0, 10, 70]
    types = ["noop", "add_numbers"] * 4
    payloads: dict[str, dict[str, Any]] = {"noop": {}, "add_numbers": {"a": 1, "b": 2}}
    queued = submit_many(
        control_plane, [request(t, payloads[t], priority=p) for t, p in zip(types, prios, strict=True)]
    )
    view = queue(control_plane, limit=100)
    # Then every one is listed once, by priority then age, numbered from 1, with a start estimate
    assert view.total == len(queued)
    order = [j.id for j in view.jobs]
    by_rank = sorted(range(len(queued)), key=lambda i: (-prios[i], i))
    assert order == [queued[i].id for i in by_rank]
    assert [j.queue_position for j in view.jobs] == list(range(1, len(queued) + 1))
    assert all(j.state == S.PENDING and j.HasField("estimated_start_time") for j in view.jobs)
    starts = [j.estimated_start_time.ToNanoseconds() for j in view.jobs]
    assert starts == sorted(starts) and starts[0] > time.time_ns() - 5_000_000_000
    # And a filter keeps each job's place in the whole queue; paging cuts the filtered list
    adds = queue(control_plane, type="add_numbers", limit=2, offset=1)
    assert adds.total == 4
    expected = [(j.id, j.queue_position) for j in view.jobs if j.type == "add_numbers"][1:3]
    assert [(j.id, j.queue_position) for j in adds.jobs] == expected
    # When the worker is freed
    control_plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=blocker.id))
    done = wait_all_done(control_plane, [j.id for j in queued])
    # Then the jobs started exactly in the listed order, and the queue is empty
    started = sorted(done, key=lambda j: j.started_at.ToNanoseconds())
    assert [j.id for j in started] == order
    assert all(j.state == S.SUCCEEDED for j in done)
    empty = queue(control_plane)
    assert (empty.total, list(empty.jobs)) == (0, [])


def test_the_queue_view_refuses_other_states_and_unknown_orders_and_estimates_nothing_before_any_start(
    control_plane: ControlProc,
) -> None:
    # Given jobs queued on a control plane whose queue has never handed out a job (no worker)
    jobs = [submit(control_plane, "noop", priority=p) for p in (1, 2)]
    view = queue(control_plane)
    # Then they have places but no estimate
    assert [(j.id, j.queue_position) for j in view.jobs] == [(jobs[1].id, 1), (jobs[0].id, 2)]
    assert not any(j.HasField("estimated_start_time") for j in view.jobs)
    # And PENDING as the status filter is the same view, any other state is refused naming status
    assert queue(control_plane, status=[S.PENDING]).jobs == view.jobs
    err = rpc_error(control_plane.jobs.ListJobs, jobs_pb2.ListJobsRequest(order=QUEUE, status=[S.PENDING, S.RUNNING]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith("status: the queue (order QUEUE) holds PENDING jobs only")
    err = rpc_error(control_plane.jobs.ListJobs, jobs_pb2.ListJobsRequest(order=7))  # type: ignore[arg-type]
    assert (err.code(), err.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "order: unknown order 7")
    # And the usual list says nothing of places
    listed = control_plane.jobs.ListJobs(jobs_pb2.ListJobsRequest(), timeout=10)
    assert {j.queue_position for j in listed.jobs} == {0}
    assert not any(j.HasField("estimated_start_time") for j in listed.jobs)


def test_client_cli_and_rest_show_the_same_queue(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given a busy worker and three queued jobs
    spawn_worker(control_plane, threads=1)
    blocker = submit(control_plane, "sleep", {"seconds": 60})
    wait_until(lambda: control_plane.get(blocker.id).state == S.RUNNING, what="blocker to run")
    jobs = [submit(control_plane, "noop", priority=p) for p in (3, 9, 6)]
    expected = [jobs[1].id, jobs[2].id, jobs[0].id]
    # Then the Python client lists them in order, with places and estimated starts
    with corral.Client(control_plane.address) as client:
        page = client.queue(limit=2)
    assert page.total == 3
    assert [(j.id, j.queue_position) for j in page.jobs] == [(expected[0], 1), (expected[1], 2)]
    assert all(j.estimated_start is not None and j.state is corral.JobState.PENDING for j in page.jobs)
    # And so does `corral queue --json`, and its table numbers the rows
    cli = [sys.executable, "-m", "corral.cli", "queue", "--control", control_plane.address]
    out = subprocess.run([*cli, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
    listed = json.loads(out)
    assert [(j["id"], j["queue_position"]) for j in listed["jobs"]] == [(e, i) for i, e in enumerate(expected, 1)]
    assert all(j["estimated_start"] for j in listed["jobs"])
    table = subprocess.run(cli, cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
    rows = [line.split() for line in table.splitlines() if any(e in line for e in expected)]
    assert [(row[0], row[1]) for row in rows] == [("1", expected[0]), ("2", expected[1]), ("3", expected[2])]
    assert "1-3 of 3 queued jobs" in table
    # And so does REST, with the place as a JSON number
    reply = Rest(control_plane.http_port).get("/v1/jobs?order=QUEUE&limit=1&offset=2")
    assert reply.status == 200, reply.body
    body = reply.json()
    assert [(j["id"], j["queuePosition"]) for j in body["jobs"]] == [(expected[2], 3)]
    assert body["total"] == "3" and "estimatedStartTime" in body["jobs"][0]
    bad = Rest(control_plane.http_port).get("/v1/jobs?order=SIDEWAYS")
    assert bad.status == 400 and bad.violation() == "order"
