"""Worker selectors on a real control plane and real workers: a job runs only on a worker whose labels
(CORRAL_WORKER_LABELS) include every key=value of its ``worker_selector``; until one connects it waits
PENDING without holding up other jobs; a bad selector is refused naming the field."""

from __future__ import annotations

from typing import Any

import grpc

from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, wait_until
from tests.support.calls import request, rpc_error, submit, submit_many, wait_all_done, wait_done

S = jobs_pb2.Job


def test_a_job_runs_only_where_its_selector_matches(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given a worker with a GPU label and one without, both with free slots
    gpu = spawn_worker(control_plane, threads=2, env={"CORRAL_WORKER_LABELS": "gpu=a100,zone=eu"})
    plain = spawn_worker(control_plane, threads=2, env={"CORRAL_WORKER_LABELS": "zone=eu"})
    # When jobs that need the GPU are submitted among jobs that do not
    picky = submit_many(control_plane, [request("sleep", {"seconds": 0.05}, worker_selector={"gpu": "a100"})] * 8)
    any_ = submit_many(control_plane, [request("sleep", {"seconds": 0.05})] * 8)
    # Then every GPU job ran on the GPU worker, and says what it needed
    done = wait_all_done(control_plane, [j.id for j in picky])
    assert {(j.state, j.worker_id) for j in done} == {(S.SUCCEEDED, gpu.worker_id)}
    assert dict(done[0].worker_selector) == {"gpu": "a100"}
    # while the others ran too, on the worker the GPU jobs left free among others
    others = wait_all_done(control_plane, [j.id for j in any_])
    assert {j.state for j in others} == {S.SUCCEEDED} and plain.worker_id in {j.worker_id for j in others}


def test_a_job_no_worker_matches_waits_without_holding_up_others(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given one worker in zone eu
    spawn_worker(control_plane, threads=1, env={"CORRAL_WORKER_LABELS": "zone=eu"})
    # When a high-priority job for zone us is queued ahead of ordinary jobs
    waiting = submit(control_plane, "noop", worker_selector={"zone": "us"}, priority=100)
    ordinary = submit_many(control_plane, [request("noop") for _ in range(5)])
    # Then the ordinary jobs run while it waits PENDING
    assert {j.state for j in wait_all_done(control_plane, [j.id for j in ordinary])} == {S.SUCCEEDED}
    assert control_plane.get(waiting.id).state == S.PENDING
    # and once a worker in zone us connects, it runs there
    us = spawn_worker(control_plane, threads=1, env={"CORRAL_WORKER_LABELS": "zone=us,gpu=none"})
    done = wait_done(control_plane, waiting.id)
    assert (done.state, done.worker_id) == (S.SUCCEEDED, us.worker_id)


def test_a_bad_selector_is_refused_naming_the_field_and_nothing_is_stored(control_plane: ControlProc) -> None:
    before = control_plane.jobs.ListJobs(jobs_pb2.ListJobsRequest()).total
    for selector, said in (
        ({f"k{i}": "v" for i in range(65)}, "worker_selector: at most 64 labels"),
        ({"gpu": "a\x00"}, "worker_selector[gpu]"),
        ({"": "x"}, "worker_selector: label keys must not be empty"),
    ):
        err = rpc_error(control_plane.jobs.SubmitJob, request("noop", worker_selector=selector))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and said in (err.details() or ""), err.details()
    assert control_plane.jobs.ListJobs(jobs_pb2.ListJobsRequest()).total == before


def test_an_idempotency_key_tells_selectors_apart(control_plane: ControlProc) -> None:
    first = submit(control_plane, "noop", idempotency_key="k-sel", worker_selector={"zone": "eu"})
    again = submit(control_plane, "noop", idempotency_key="k-sel", worker_selector={"zone": "eu"})
    assert again.id == first.id
    err = rpc_error(
        control_plane.jobs.SubmitJob, request("noop", idempotency_key="k-sel", worker_selector={"zone": "us"})
    )
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS


def test_a_selector_survives_a_restart(control_plane: ControlProc, spawn_worker: Any) -> None:
    job = submit(control_plane, "noop", worker_selector={"zone": "ap"})
    control_plane.stop()
    control_plane.start()
    assert dict(control_plane.get(job.id).worker_selector) == {"zone": "ap"}
    worker = spawn_worker(control_plane, threads=1, env={"CORRAL_WORKER_LABELS": "zone=ap"})
    wait_until(lambda: control_plane.get(job.id).state == S.SUCCEEDED, what="the job to run after the restart")
    assert control_plane.get(job.id).worker_id == worker.worker_id
