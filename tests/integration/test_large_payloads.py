"""A large payload, refused or accepted, does not hold up the control plane's other calls.

Before: a REST POST /v1/jobs of 12.6 MB (a payload of 6.3 million numbers, under the 64 MiB body limit)
held the event loop 23 s while it was parsed and converted, only to be refused for its size: /healthz,
every gRPC call and the workers' heartbeats waited all that time. A valid gRPC payload of 500,000
numbers (1 MB of JSON) held it about 2 s. Now a payload whose size alone shows it is over
CORRAL_MAX_PAYLOAD_BYTES is refused before it is converted, and a large one is converted and checked on a
worker thread.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import pytest

from corral.v1 import jobs_pb2, jobs_pb2_grpc
from tests.conftest import ControlProc
from tests.support.calls import request, stored

STALL_BOUND = 2.0
"""The slowest a health or GetJob call may answer while a large payload is handled (the stall was 23 s
for the REST body, about 2 s for the valid gRPC payloads)."""
PATIENCE = 120.0
"""How long the large call itself is waited for (a hang guard, not a bound)."""


def _numbers_body(n: int) -> bytes:
    return b'{"type":"noop","payload":{"x":[' + b",".join([b"1"] * n) + b"]}}"


@contextmanager
def _slowest(call: Callable[[], None]) -> Iterator[list[float]]:
    """Make ``call`` over and over on a thread while the block runs; yields the list of how long each took,
    filled in when the block ends (the call in flight then included)."""
    took: list[float] = []
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            start = time.monotonic()
            call()
            took.append(time.monotonic() - start)
            done.wait(0.05)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield took
    finally:
        done.set()
        thread.join(PATIENCE)


def _healthz(cp: ControlProc) -> Callable[[], None]:
    def call() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", cp.http_port, timeout=PATIENCE)
        try:
            conn.request("GET", "/healthz")
            assert conn.getresponse().status == 200
        finally:
            conn.close()

    return call


def _post(cp: ControlProc, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", cp.http_port, timeout=PATIENCE)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_a_rest_body_with_a_payload_far_over_the_limit_is_refused_without_stalling_health(
    control_plane: ControlProc,
) -> None:
    # Given the probe's body: 12.6 MB, a payload of 6.3 million numbers, under CORRAL_HTTP_MAX_BODY_BYTES
    body = _numbers_body(6_300_000)
    # When it is posted while another client asks /healthz over and over
    with _slowest(_healthz(control_plane)) as took:
        status, answer = _post(control_plane, "/v1/jobs", body)
    # Then it is refused naming the payload and the limit, health answered all along, and nothing is stored
    assert status == 400, answer
    assert answer["message"].startswith("payload: is at least ")
    assert answer["message"].endswith("the limit is 1048576 bytes")
    assert took and max(took) < STALL_BOUND, f"slowest /healthz {max(took):.2f}s"
    assert stored(control_plane) == 0


def test_a_rest_body_just_over_the_limit_is_refused_without_stalling_health(control_plane: ControlProc) -> None:
    # Given a payload just over the limit, which only its exact JSON size tells: 110,000 numbers of 9
    # digits (a number might be as short as 1 digit once converted), so it is converted, off the loop
    payload = {"x": [123456789] * 110_000}
    size = len(json.dumps(payload, separators=(",", ":")))
    body = json.dumps({"type": "noop", "payload": payload}).encode()
    with _slowest(_healthz(control_plane)) as took:
        status, answer = _post(control_plane, "/v1/jobs", body)
    assert status == 400, answer
    assert answer["message"] == f"payload: is {size} bytes; the limit is 1048576 bytes"
    assert max(took) < STALL_BOUND
    assert stored(control_plane) == 0


def test_valid_large_grpc_payloads_are_accepted_while_get_job_answers(control_plane: ControlProc) -> None:
    # Given a job to read, and a payload of 500,000 numbers: 1,000,007 bytes of JSON, within the 1 MiB limit
    known = control_plane.jobs.SubmitJob(request("noop"), timeout=10).job.id
    big = request("noop", {"x": [1] * 500_000})
    other = grpc.insecure_channel(control_plane.address)  # another client, with a connection of its own
    mine = grpc.insecure_channel(control_plane.address, options=[("grpc.max_receive_message_length", 64 << 20)])
    try:
        stub = jobs_pb2_grpc.JobServiceStub(mine)  # the answers carry the payloads: 5.5 MB each
        get = other.unary_unary(
            "/corral.v1.JobService/GetJob",
            request_serializer=jobs_pb2.GetJobRequest.SerializeToString,
            response_deserializer=jobs_pb2.Job.FromString,
        )

        def get_job() -> None:
            assert get(jobs_pb2.GetJobRequest(id=known), timeout=PATIENCE).id == known

        get_job()  # connected before the clock starts
        # When it is submitted three times, once in a batch, while another client reads a job over and over
        with _slowest(get_job) as took:
            one = stub.SubmitJob(big, timeout=PATIENCE).job
            batch = stub.SubmitJobs(jobs_pb2.SubmitJobsRequest(jobs=[big, big]), timeout=PATIENCE).jobs
        total = stub.ListJobs(jobs_pb2.ListJobsRequest(limit=1), timeout=PATIENCE).total
    finally:
        other.close()
        mine.close()
    # Then all are accepted with their payloads, and the reads answered all along
    assert len(one.payload.fields["x"].list_value.values) == 500_000
    assert [len(j.payload.fields["x"].list_value.values) for j in batch] == [500_000, 500_000]
    assert max(took) < STALL_BOUND / 2, f"slowest GetJob {max(took):.2f}s"
    assert total == 4


@pytest.mark.parametrize("batch", [False, True])
def test_a_grpc_payload_far_over_the_limit_is_refused_before_conversion(
    control_plane: ControlProc, batch: bool
) -> None:
    # Given a payload of 2 million numbers: 22 MB encoded, at least 4 MB as JSON, over the 1 MiB limit
    big = request("noop", {"x": [1] * 2_000_000})
    # When it is submitted, alone or as a batch's second job
    with pytest.raises(grpc.RpcError) as caught:
        if batch:
            control_plane.jobs.SubmitJobs(jobs_pb2.SubmitJobsRequest(jobs=[request("noop"), big]), timeout=PATIENCE)
        else:
            control_plane.jobs.SubmitJob(big, timeout=PATIENCE)
    # Then it is INVALID_ARGUMENT naming the payload and the limit, and nothing is stored
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    field = "jobs[1].payload" if batch else "payload"
    assert caught.value.details().startswith(f"{field}: is at least ")
    assert caught.value.details().endswith("the limit is 1048576 bytes")
    assert stored(control_plane) == 0
