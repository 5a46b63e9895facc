"""GPUs and memory on the client: JobSpec's gpu_count / memory_mb, what Client.submit sends, and the values
read back (Job, WorkerInfo).

The client refuses a value outside corral.limits before sending anything, naming the field (and, in a
batch, the job) as the control plane would.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from corral import AsyncClient, Client, InvalidArgument, Job, JobSpec, WorkerInfo
from corral.limits import MAX_GPUS, MAX_MEMORY_MB
from corral.spec import batch_request
from corral.v1 import admin_pb2, jobs_pb2, jobs_pb2_grpc


@pytest.mark.parametrize(
    ("fields", "field", "rule"),
    [
        ({"gpu_count": -1}, "gpu_count", "must be between 0 and 64, got -1"),
        ({"gpu_count": 65}, "gpu_count", "must be between 0 and 64, got 65"),
        ({"gpu_count": "2"}, "gpu_count", "must be an integer between 0 and 64, got '2'"),
        ({"gpu_count": 1.0}, "gpu_count", "must be an integer between 0 and 64, got 1.0"),
        ({"gpu_count": True}, "gpu_count", "must be an integer between 0 and 64, got True"),
        ({"memory_mb": -1}, "memory_mb", "must be between 0 and 1073741824, got -1"),
        ({"memory_mb": 2**30 + 1}, "memory_mb", "must be between 0 and 1073741824, got 1073741825"),
        ({"memory_mb": 2**40}, "memory_mb", "must be between 0 and 1073741824, got 1099511627776"),
        ({"memory_mb": "4096"}, "memory_mb", "got '4096'"),
    ],
)
def test_gpus_and_memory_outside_the_limits_are_refused_naming_the_field(
    fields: dict[str, Any], field: str, rule: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        JobSpec("noop", **fields).to_proto()
    assert info.value.field == field and rule in info.value.rule
    assert str(info.value) == f"{field}: {info.value.rule}"


@pytest.mark.parametrize(("fields", "field"), [({"gpu_count": 65}, "gpu_count"), ({"memory_mb": -1}, "memory_mb")])
def test_a_batch_names_the_job_whose_gpus_or_memory_are_refused(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        batch_request([JobSpec("noop"), JobSpec("noop", gpu_count=1), JobSpec("noop"), JobSpec("noop", **fields)])
    assert info.value.field == f"jobs[3].{field}"


def test_the_request_carries_gpus_and_memory_and_the_limits_themselves_pass() -> None:
    request = JobSpec("noop", gpu_count=2, memory_mb=4096).to_proto()
    assert (request.gpu_count, request.memory_mb) == (2, 4096)
    bare = JobSpec("noop").to_proto()
    assert (bare.gpu_count, bare.memory_mb) == (0, 0)
    most = JobSpec("noop", gpu_count=MAX_GPUS, memory_mb=MAX_MEMORY_MB).to_proto()
    assert (most.gpu_count, most.memory_mb) == (64, 2**30)
    batch = batch_request([JobSpec("noop"), JobSpec("noop", gpu_count=1, memory_mb=512)])
    assert [(j.gpu_count, j.memory_mb) for j in batch.jobs] == [(0, 0), (1, 512)]


def test_job_and_worker_info_read_gpus_and_memory_from_the_proto() -> None:
    job = Job.from_proto(jobs_pb2.Job(id="j", type="noop", gpu_count=2, memory_mb=4096))
    assert (job.gpu_count, job.memory_mb) == (2, 4096)
    assert job.to_dict()["gpu_count"] == 2 and job.to_dict()["memory_mb"] == 4096
    assert (Job.from_proto(jobs_pb2.Job(id="j")).gpu_count, Job.from_proto(jobs_pb2.Job(id="j")).memory_mb) == (0, 0)

    worker = WorkerInfo.from_proto(admin_pb2.Worker(id="w", gpus=4, free_gpus=1, memory_mb=65536, free_memory_mb=12288))
    assert (worker.gpus, worker.free_gpus, worker.memory_mb, worker.free_memory_mb) == (4, 1, 65536, 12288)
    out = json.loads(json.dumps(worker.to_dict()))
    assert (out["gpus"], out["free_gpus"], out["memory_mb"], out["free_memory_mb"]) == (4, 1, 65536, 12288)


class _Recorder(jobs_pb2_grpc.JobServiceServicer):
    """A JobService that keeps what SubmitJob received and answers with a job holding the same resources."""

    def __init__(self) -> None:
        self.requests: list[jobs_pb2.SubmitJobRequest] = []

    def SubmitJob(
        self, request: jobs_pb2.SubmitJobRequest, context: grpc.ServicerContext
    ) -> jobs_pb2.SubmitJobResponse:
        self.requests.append(request)
        job = jobs_pb2.Job(
            id=f"j{len(self.requests)}",
            type=request.type,
            state=jobs_pb2.Job.PENDING,
            gpu_count=request.gpu_count,
            memory_mb=request.memory_mb,
        )
        return jobs_pb2.SubmitJobResponse(job=job)


@pytest.fixture
def recorder() -> Iterator[tuple[str, _Recorder]]:
    servicer = _Recorder()  # type: ignore[abstract]  # only SubmitJob is called
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    jobs_pb2_grpc.add_JobServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(None)


def test_both_clients_send_gpus_and_memory_and_read_them_back(recorder: tuple[str, _Recorder]) -> None:
    address, servicer = recorder
    # Given a client of each kind
    with Client(address, timeout=10) as client:
        # When each submits a job asking for GPUs and memory
        job = client.submit("noop", gpu_count=2, memory_mb=4096)

    async def submit_async() -> Job:
        async with AsyncClient(address, timeout=10) as client:
            return await client.submit("noop", gpu_count=1, memory_mb=512)

    async_job = asyncio.run(submit_async())
    # Then the requests carried them, and the jobs answered hold them
    assert [(r.gpu_count, r.memory_mb) for r in servicer.requests] == [(2, 4096), (1, 512)]
    assert (job.gpu_count, job.memory_mb, async_job.gpu_count, async_job.memory_mb) == (2, 4096, 1, 512)


def test_both_clients_refuse_bad_gpus_before_sending(recorder: tuple[str, _Recorder]) -> None:
    address, servicer = recorder
    with Client(address, timeout=10) as client, pytest.raises(InvalidArgument) as info:
        client.submit("noop", gpu_count=65)
    assert info.value.field == "gpu_count"

    async def submit_async() -> None:
        async with AsyncClient(address, timeout=10) as client:
            await client.submit("noop", memory_mb=2**30 + 1)

    with pytest.raises(InvalidArgument) as info:
        asyncio.run(submit_async())
    assert info.value.field == "memory_mb"
    assert servicer.requests == []
