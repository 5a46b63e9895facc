"""Large job outputs: what the worker's stream, GetJob and ListJobs can carry, and what happens past it."""

from __future__ import annotations

from typing import Any

import grpc

from corral.client import DEFAULT_CHANNEL_OPTIONS
from corral.limits import MAX_RESULT_BYTES
from corral.v1 import jobs_pb2, jobs_pb2_grpc
from tests.conftest import ControlProc
from tests.support.calls import submit, wait_done

S = jobs_pb2.Job


def test_a_result_over_the_limit_fails_its_job_and_the_worker_goes_on(
    control_plane: ControlProc, spawn_worker: Any
) -> None:
    # Given one worker with one slot
    spawn_worker(control_plane, threads=1, imports=("tests.support.jobtypes",))
    # When a job returns more than a gRPC message can hold (before: the worker's stream broke on it,
    # and the worker reconnected and resent it for ever, its other results stuck behind it)
    big = submit(control_plane, "big_output", {"result_bytes": 70 << 20}, max_attempts=1)
    # Then the job fails, saying why
    done = wait_done(control_plane, big.id, timeout=60)
    assert (done.state, done.error.code) == (S.FAILED, "RESULT_TOO_LARGE")
    assert "over the limit of" in done.error.message
    # and the same worker runs the next job
    after = wait_done(control_plane, submit(control_plane, "noop").id)
    assert after.state == S.SUCCEEDED and after.worker_id == done.worker_id


class _Roomy:
    """Stubs on a channel that takes answers as large as the server sends (gRPC's default is 4 MiB;
    Corral's clients take 64 MiB, as here)."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address, options=DEFAULT_CHANNEL_OPTIONS)
        self.jobs = jobs_pb2_grpc.JobServiceStub(self.channel)


def test_list_pages_stop_before_their_answer_outgrows_a_message(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given 9 jobs whose results are each just under the limit: 72 MiB together, more than one
    # gRPC answer holds (64 MiB); before, every ListJobs that took them all failed RESOURCE_EXHAUSTED
    spawn_worker(control_plane, threads=2, imports=("tests.support.jobtypes",))
    roomy = _Roomy(control_plane.address)
    size = MAX_RESULT_BYTES - 100
    ids = [submit(roomy, "big_output", {"result_bytes": size}).id for _ in range(9)]
    for job_id in ids:
        assert wait_done(roomy, job_id, timeout=60).state == S.SUCCEEDED
    # When they are listed with a limit that would take them all
    seen: list[str] = []
    pages = 0
    while True:
        page = roomy.jobs.ListJobs(jobs_pb2.ListJobsRequest(limit=50, offset=len(seen)), timeout=30)
        assert page.total == 9
        if not page.jobs:
            break
        pages += 1
        seen += [job.id for job in page.jobs]
        assert all(len(job.result["x"]) == size for job in page.jobs)
    roomy.channel.close()
    # Then each answer holds what fits, and paging on with offset + len(jobs) sees every job once
    assert pages > 1
    assert seen == list(reversed(ids))
