"""The REST bridge's JSON, at the edges a probe found: numbers beyond a double, unknown enum numbers in
the query string, negative zero, against a real control plane on 127.0.0.1."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from corral.v1 import jobs_pb2
from tests.conftest import ControlProc
from tests.integration.test_rest import Rest, http_port
from tests.support.calls import submit, wait_done
from tests.support.old_peers import OldWorker
from tests.support.signs import signs

BIG = "1" + "0" * 400
"""An integer literal beyond a double's range (about 1.8e308)."""


# ---- numbers beyond a double -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "raw", "field"),
    [
        pytest.param("/v1/jobs", b'{"type": "noop", "payload": {"x": 1E400}}', "payload.x", id="payload"),
        pytest.param("/v1/jobs", b'{"type": "noop", "payload": {"x": -1E400}}', "payload.x", id="negative"),
        pytest.param("/v1/jobs", b'{"type": "noop", "payload": {"x": [1, 2.5, -1e999]}}', "payload.x[2]",
                     id="in-array"),
        pytest.param("/v1/jobs", b'{"type": "noop", "payload": {"a": [1, {"b": {"c": [[0, 1e400]]}}]}}',
                     "payload.a[1].b.c[0][1]", id="nested"),
        pytest.param("/v1/jobs", b'{"type": "noop", "timeoutSec": 1e400}', "timeout_sec", id="double-field"),
        pytest.param("/v1/jobs", b'{"type": "noop", "timeoutSec": ' + BIG.encode() + b"}", "timeout_sec",
                     id="double-field-integer"),
        pytest.param("/v1/jobs", b'{"type": "noop", "priority": -1E400}', "priority", id="int-field"),
        pytest.param("/v1/jobs", b'{"type": "noop", "labels": {"k": 1E400}}', "labels.k", id="map-value"),
        pytest.param("/v1/jobs:batchSubmit", b'{"jobs": [{"type": "noop"}, {"type": "noop", "payload": {"x": 1E400}}]}',
                     "jobs[1].payload.x", id="batch"),
        pytest.param("/v1/jobs:runMany", b'{"tag": "a", "job": {"type": "noop"}} {"tag": "b", "job": {"type": "noop", '
                     b'"payload": {"x": [1E400]}}}', "requests[1].job.payload.x[0]", id="stream"),
    ],
)  # fmt: skip
def test_a_number_beyond_a_double_is_400_naming_its_field_and_stores_nothing(
    refusing_control_plane: ControlProc, path: str, raw: bytes, field: str
) -> None:
    # It was a 400 that named no field ("request body is not valid JSON: number 1E400 is out of range"),
    # and an integer literal that large in a double field (timeoutSec) was a 500.
    rest = Rest(http_port(refusing_control_plane))
    reply = rest.call("POST", path, raw=raw)
    assert reply.status == 400, reply.body
    status = reply.json()
    assert status["code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0], status
    assert reply.violation() == field, status
    assert "beyond what a double can hold" in status["message"], status
    assert rest.total() == 0


def test_numbers_a_double_holds_still_pass(refusing_control_plane: ControlProc) -> None:
    # The largest double, the smallest subnormal, and one that underflows to 0 (as Go's ParseFloat takes it)
    rest = Rest(http_port(refusing_control_plane))
    raw = b'{"type": "nope", "payload": {"max": 1.7976931348623157e308, "min": -5e-324, "under": 1e-400}}'
    reply = rest.call("POST", "/v1/jobs", raw=raw)
    assert reply.status == 400 and reply.violation() == "type", reply.body  # refused for its type only
    assert rest.total() == 0


def test_a_query_number_beyond_a_double_is_named(refusing_control_plane: ControlProc) -> None:
    rest = Rest(http_port(refusing_control_plane))
    for query, field in [("limit=1E400", "limit"), ("offset=-1E400", "offset"), ("limit=" + BIG, "limit")]:
        reply = rest.get(f"/v1/jobs?{query}")
        assert reply.status == 400 and reply.violation() == field, (query, reply.body)


# ---- repeated query parameters ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("status=99", "status[0]"),
        ("status=PENDING&status=99", "status[1]"),
        ("status=PENDING&status=RUNNING&status=-3", "status[2]"),
        ("status=PENDING&status=DONE", "status[1]"),
        ("status=99&status=DONE", "status[0]"),
        ("order=99", "order"),
    ],
)
def test_an_unknown_enum_value_in_the_query_names_its_element(
    refusing_control_plane: ControlProc, query: str, field: str
) -> None:
    # ?status=99 was named "status", where ?status=DONE is "status[0]"; grpc-gateway's query parser
    # refuses an enum number its enum does not list, as it does a name.
    reply = Rest(http_port(refusing_control_plane)).get(f"/v1/jobs?{query}")
    assert reply.status == 400, reply.body
    assert reply.violation() == field, reply.body
    assert reply.json()["code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]


def test_known_enum_numbers_in_the_query_still_filter(refusing_control_plane: ControlProc) -> None:
    rest = Rest(http_port(refusing_control_plane))
    assert rest.get("/v1/jobs?status=2&status=RUNNING&order=0").status == 200


# ---- negative zero ---------------------------------------------------------------------------------
def _numbers(raw: bytes) -> Any:
    """``raw`` JSON with every number a float, so that ``-0`` keeps its sign."""
    return json.loads(raw, parse_int=float)


def test_a_negative_zero_in_a_result_keeps_its_sign(control_plane: ControlProc) -> None:
    # Given a job whose result holds -0.0 (sent by a raw worker stream: no built-in type makes one)
    cp = control_plane
    raw = OldWorker(cp.channel(), "raw-w")
    raw.next("registered")
    job = submit(cp, "noop", max_attempts=1)
    assert [(a.job_id, a.attempt) for a in raw.next("assign").assign.assignments] == [(job.id, 1)]
    raw.result(job.id, 1, result_json='{"z": -0.0, "zs": [-0.0, 0.0, {"deep": -0}], "text": "-0.0,", "one": -1.0}')
    done = wait_done(cp, job.id)
    raw.close()
    assert done.state == jobs_pb2.Job.SUCCEEDED, done.error
    # gRPC carries the sign (a Struct number is a double)
    assert math.copysign(1, done.result.fields["z"].number_value) == -1

    # When REST reads it, GetJob, ListJobs and WatchJob alike
    rest = Rest(http_port(cp))
    got = rest.get(f"/v1/jobs/{job.id}")
    listed = rest.get("/v1/jobs")
    watched = rest.get(f"/v1/jobs/{job.id}:watch")
    assert got.status == listed.status == watched.status == 200

    # Then each number keeps the sign gRPC gives it, -0 written as Go's protojson writes it
    want = signs(json_format.MessageToDict(done.result))
    assert want == {"z": -1.0, "zs": [-1.0, 1.0, {"deep": want["zs"][2]["deep"]}], "text": "-0.0,", "one": -1.0}
    assert re.search(rb'"z":-0[,}]', got.body), got.body
    for answer in (
        _numbers(got.body)["result"],
        _numbers(listed.body)["jobs"][0]["result"],
        _numbers(watched.body.splitlines()[-1])["result"]["job"]["result"],
    ):
        assert signs(answer) == want, answer
    assert json.loads(got.body)["result"]["one"] == -1  # integral: no fraction, as before


def test_a_negative_zero_in_a_payload_keeps_its_sign(control_plane: ControlProc) -> None:
    # Given a payload holding -0.0, sent over gRPC (a Struct double) and over REST (a JSON -0.0)
    cp = control_plane
    payload = jobs_pb2.SubmitJobRequest(type="noop").payload
    payload.update({"z": -0.0, "zs": [-0.0, 1.5]})
    sent = cp.jobs.SubmitJob(jobs_pb2.SubmitJobRequest(type="noop", payload=payload), timeout=10)
    rest = Rest(http_port(cp))
    posted = rest.post("/v1/jobs", {"type": "noop", "payload": {"z": -0.0, "zs": [-0.0, 1.5]}})
    assert posted.status == 200, posted.body

    # When each is read back, over gRPC and over REST
    for job_id in (sent.job.id, posted.json()["job"]["id"]):
        stored = cp.get(job_id).payload
        read = rest.get(f"/v1/jobs/{job_id}")

        # Then the sign is kept (the store took it as the integer 0 before)
        assert math.copysign(1, stored.fields["z"].number_value) == -1, stored
        assert math.copysign(1, stored.fields["zs"].list_value.values[0].number_value) == -1, stored
        assert signs(_numbers(read.body)["payload"]) == {"z": -1.0, "zs": [-1.0, 1.0]}, read.body


@pytest.mark.parametrize("call", ["ListJobs", "CancelJobs"])
def test_an_unknown_state_over_grpc_names_its_element(refusing_control_plane: ControlProc, call: str) -> None:
    # status=[PENDING, 99] was named "status": the element is status[1], as the REST query names it
    cp = refusing_control_plane
    request: Any = (
        jobs_pb2.ListJobsRequest(status=[jobs_pb2.Job.PENDING, jobs_pb2.Job.State.ValueType(99)])
        if call == "ListJobs"
        else jobs_pb2.CancelJobsRequest(status=[jobs_pb2.Job.PENDING, jobs_pb2.Job.State.ValueType(99)])
    )
    with pytest.raises(grpc.RpcError) as caught:
        getattr(cp.jobs, call)(request, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert caught.value.details().startswith("status[1]:"), caught.value.details()  # type: ignore[attr-defined]
