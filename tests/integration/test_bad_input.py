"""Bad input: a clear INVALID_ARGUMENT naming the field, and nothing stored.

Every test here is refused or only reads, so they share one control plane (``refusing_control_plane``),
and each checks that it still stores no job at all."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from corral.v1 import admin_pb2, jobs_pb2
from tests.conftest import ControlProc
from tests.support.calls import field_of, nested, request, rpc_error


@pytest.fixture
def control_plane(refusing_control_plane: ControlProc) -> ControlProc:
    return refusing_control_plane


def _stored(cp: ControlProc) -> int:
    return int(cp.jobs.ListJobs(jobs_pb2.ListJobsRequest(limit=1)).total)


CASES: list[tuple[str, jobs_pb2.SubmitJobRequest, str]] = [
    ("unknown type", request("no_such_type"), "type"),
    ("payload breaks schema", request("add_numbers", {"a": 1}), "payload"),
    ("wrong JSON type", request("add_numbers", {"a": "one", "b": 2}), "payload.a"),
    ("wrong item type", request("large_array_sum", {"numbers": [1, 2, "3"]}), "payload.numbers[2]"),
    ("negative timeout", request("noop", timeout_sec=-5), "timeout_sec"),
    ("zero timeout", request("noop", timeout_sec=0), "timeout_sec"),
    ("priority out of range", request("noop", priority=101), "priority"),
    ("negative priority", request("noop", priority=-1), "priority"),
    ("thread_demand 0", request("noop", thread_demand=0), "thread_demand"),
    ("max_attempts 0", request("noop", max_attempts=0), "max_attempts"),
    ("oversized payload", request("reverse_string", {"text": "x" * (1 << 20)}), "payload"),
    ("extra field", request("sleep", {"seconds": 1, "unexpected": True}), "payload"),
    # 33 levels was stored, but GetJob, WatchJob and ListJobs failed for ever ("Exception deserializing response!")
    ("nested 33 levels", request("noop", nested(32)), "payload" + ".a" * 32),
    # A Timestamp protobuf allows none of these; they were INTERNAL
    (
        "negative nanos",
        jobs_pb2.SubmitJobRequest(type="noop", scheduled_at=Timestamp(seconds=1, nanos=-5)),
        "scheduled_at",
    ),
    ("after 9999", jobs_pb2.SubmitJobRequest(type="noop", scheduled_at=Timestamp(seconds=2**62)), "scheduled_at"),
    ("before year 1", jobs_pb2.SubmitJobRequest(type="noop", scheduled_at=Timestamp(seconds=-(2**40))), "scheduled_at"),
]


@pytest.mark.parametrize(("name", "req", "field"), CASES, ids=[c[0] for c in CASES])
def test_bad_submission_names_the_field_and_stores_nothing(
    control_plane: ControlProc, name: str, req: jobs_pb2.SubmitJobRequest, field: str
) -> None:
    refusals = {
        "SubmitJob": rpc_error(control_plane.jobs.SubmitJob, req),
        # The same submission in one call with its watch: the same refusal, before the stream says anything
        "RunJob": rpc_error(lambda: list(control_plane.jobs.RunJob(req, timeout=30))),
    }
    for call, err in refusals.items():
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, call  # type: ignore[attr-defined]
        assert field_of(err) == field, call
        assert (err.details() or "").startswith(field), call  # type: ignore[attr-defined]
    assert _stored(control_plane) == 0


def test_invalid_utf8_is_named(control_plane: ControlProc) -> None:
    raw = control_plane.channel().unary_unary(
        "/corral.v1.JobService/SubmitJob", request_serializer=lambda b: b, response_deserializer=lambda b: b
    )
    for req, field in [
        (jobs_pb2.SubmitJobRequest(type="noop", name="MARK"), "name"),
        (jobs_pb2.SubmitJobRequest(type="noop", labels={"k": "MARK"}), "labels[0].value"),
    ]:
        data = req.SerializeToString().replace(b"MARK", b"\xff\xfe\xfd\xfc")
        err = rpc_error(raw, data)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        assert field_of(err) == field
    assert _stored(control_plane) == 0


def test_a_bad_job_in_a_batch_rejects_the_whole_batch(control_plane: ControlProc) -> None:
    batch = jobs_pb2.SubmitJobsRequest(jobs=[request("noop"), request("noop", priority=1000), request("noop")])
    err = rpc_error(control_plane.jobs.SubmitJobs, batch)
    assert field_of(err) == "jobs[1].priority"
    assert _stored(control_plane) == 0


@pytest.mark.parametrize(
    ("call", "req", "field"),
    [
        ("GetJob", jobs_pb2.GetJobRequest(id=""), "id"),
        ("ListJobs", jobs_pb2.ListJobsRequest(limit=5000), "limit"),
        ("ListJobs", jobs_pb2.ListJobsRequest(offset=-1), "offset"),
        # longer than any job type can be: it listed none, as if the filter were right
        ("ListJobs", jobs_pb2.ListJobsRequest(type="x" * 1000), "type"),
        ("ListJobs", jobs_pb2.ListJobsRequest(status=[jobs_pb2.Job.State.ValueType(99)]), "status[0]"),
        ("GetJob", jobs_pb2.GetJobRequest(id="x" * 10_000), "id"),
        # The not-found message quoted the whole id: 10 KB of status metadata, and the caller got
        # RESOURCE_EXHAUSTED "Stream removed" instead of the error
        ("DrainWorker", admin_pb2.DrainWorkerRequest(id="x" * 10_000), "id"),
        ("DrainWorker", admin_pb2.DrainWorkerRequest(id=""), "id"),
    ],
)
def test_bad_reads_name_the_field(control_plane: ControlProc, call: str, req: Any, field: str) -> None:
    stub = control_plane.admin if call == "DrainWorker" else control_plane.jobs
    err = rpc_error(getattr(stub, call), req)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert field_of(err) == field


def test_unknown_job_is_not_found(control_plane: ControlProc) -> None:
    err = rpc_error(control_plane.jobs.GetJob, jobs_pb2.GetJobRequest(id="nope"))
    assert err.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
