"""Jobs as Python values: Job.from_proto, JobState, JobSpec.to_proto, and the cluster values."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from google.protobuf import struct_pb2, timestamp_pb2

from corral import (
    AsyncClient,
    Client,
    InvalidArgument,
    Job,
    JobError,
    JobSpec,
    JobState,
    Stats,
    WorkerInfo,
    WorkerState,
)
from corral.client import list_request
from corral.job import dict_to_struct, struct_to_dict
from corral.spec import batch_request, by_id
from corral.v1 import admin_pb2, jobs_pb2
from tests.support.calls import nested


def _ts(seconds: float) -> timestamp_pb2.Timestamp:
    whole = int(seconds)
    return timestamp_pb2.Timestamp(seconds=whole, nanos=round((seconds - whole) * 1e9))


def _struct(value: dict[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s


def test_job_state_matches_the_proto_enum() -> None:
    proto = {v.name: v.number for v in jobs_pb2.Job.State.DESCRIPTOR.values}
    assert {s.name: s.value for s in JobState} == proto


@pytest.mark.parametrize("state", list(JobState))
def test_only_succeeded_failed_and_cancelled_are_terminal(state: JobState) -> None:
    assert state.is_terminal == (state in {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


def test_job_state_parse_accepts_names_numbers_and_members() -> None:
    assert JobState.parse("running") is JobState.RUNNING
    assert JobState.parse(" Failed ") is JobState.FAILED
    assert JobState.parse(4) is JobState.SUCCEEDED
    assert JobState.parse(JobState.PENDING) is JobState.PENDING
    with pytest.raises(InvalidArgument) as info:
        JobState.parse("done")
    assert info.value.field == "status"


def test_from_proto_converts_every_field() -> None:
    # Given a job message with every field set
    pb = jobs_pb2.Job(
        id="j1",
        name="n",
        type="add_numbers",
        payload=_struct({"a": 1, "b": 2.5, "nested": {"xs": [1, 2.0, "s"]}}),
        priority=7,
        thread_demand=4,
        threads_granted=2,
        state=jobs_pb2.Job.SUCCEEDED,
        attempts=2,
        max_attempts=3,
        timeout_sec=1.5,
        scheduled_at=_ts(1_700_000_000),
        created_at=_ts(1_700_000_001.25),
        started_at=_ts(1_700_000_002),
        finished_at=_ts(1_700_000_003),
        ready_at=_ts(1_700_000_001.5),
        queue_seconds=0.25,
        exec_seconds=1.0,
        total_seconds=2.0,
        worker_id="w1",
        result=_struct({"sum": 3}),
        error=jobs_pb2.JobError(code="ERROR", message="first attempt"),
        idempotency_key="k",
        labels={"team": "a"},
    )
    # When it is converted
    job = Job.from_proto(pb)
    # Then integral numbers are ints again, times are aware UTC datetimes, the state is a JobState
    assert job.payload == {"a": 1, "b": 2.5, "nested": {"xs": [1, 2, "s"]}}
    assert isinstance(job.payload["a"], int) and isinstance(job.payload["nested"]["xs"][1], int)
    assert job.result == {"sum": 3} and isinstance(job.result["sum"], int)
    assert job.state is JobState.SUCCEEDED and job.is_terminal
    assert job.created_at == datetime(2023, 11, 14, 22, 13, 21, 250000, tzinfo=UTC)
    assert job.scheduled_at is not None and job.scheduled_at.tzinfo is UTC
    assert job.error == JobError("ERROR", "first attempt")
    assert job.labels == {"team": "a"}
    assert (job.priority, job.thread_demand, job.threads_granted, job.attempts, job.max_attempts) == (7, 4, 2, 2, 3)
    assert (job.queue_seconds, job.exec_seconds, job.total_seconds, job.timeout_sec) == (0.25, 1.0, 2.0, 1.5)
    assert (job.worker_id, job.idempotency_key, job.name, job.type) == ("w1", "k", "n", "add_numbers")


def test_from_proto_leaves_unset_fields_empty() -> None:
    job = Job.from_proto(jobs_pb2.Job(id="j", type="noop", state=jobs_pb2.Job.PENDING))
    assert job.payload == {}
    assert job.result is None and job.error is None
    assert job.created_at is None and job.started_at is None and job.finished_at is None and job.ready_at is None
    assert not job.is_terminal


def test_an_empty_result_of_a_finished_job_is_an_empty_dict() -> None:
    pb = jobs_pb2.Job(id="j", type="noop", state=jobs_pb2.Job.SUCCEEDED, result=struct_pb2.Struct())
    assert Job.from_proto(pb).result == {}


def test_to_dict_is_json_ready() -> None:
    pb = jobs_pb2.Job(
        id="j", type="t", state=jobs_pb2.Job.FAILED, created_at=_ts(0), error=jobs_pb2.JobError(code="TIMEOUT")
    )
    out = Job.from_proto(pb).to_dict()
    assert out["state"] == "FAILED"
    assert out["created_at"] == "1970-01-01T00:00:00+00:00"
    assert out["error"] == {"code": "TIMEOUT", "message": ""}
    json.dumps(out)


def test_struct_round_trip_and_errors() -> None:
    assert struct_to_dict(dict_to_struct({"a": [1, {"b": None}], "c": True})) == {"a": [1, {"b": None}], "c": True}
    with pytest.raises(InvalidArgument) as info:
        dict_to_struct([1, 2])  # type: ignore[arg-type]
    assert info.value.field == "payload"
    with pytest.raises(InvalidArgument):
        dict_to_struct({"s": {1, 2}})


def test_a_struct_reads_back_with_its_keys_sorted_at_every_level() -> None:
    # Given a payload whose keys are in no order, with an object in an object and in a list
    payload = {"zeta": 1, "b": {"y": 2, "x": 1, "w": 0}, "a": [{"d": 1, "c": 2}], "m": "é"}
    # When it goes through a Struct, whose map keeps no order of its own
    back = struct_to_dict(dict_to_struct(payload))
    # Then it is the same value, and every object's keys come sorted, so it prints the same every time
    assert back == payload
    assert list(back) == ["a", "b", "m", "zeta"]
    assert list(back["b"]) == ["w", "x", "y"]
    assert list(back["a"][0]) == ["c", "d"]
    assert json.dumps(back) == json.dumps(payload, sort_keys=True)


@pytest.mark.parametrize(
    ("payload", "field", "rule"),
    [
        ({"a": math.inf}, "payload.a", "must be a finite number, got inf"),
        ({"a": [1, {"b": math.nan}]}, "payload.a[1].b", "must be a finite number, got nan"),
        ({"a": 2**53 + 1}, "payload.a", "beyond ±2**53"),
        ({"a": -(2**60)}, "payload.a", "beyond ±2**53"),
        ({1: 2}, "payload", "keys must be strings"),
        ({"a": {"b": b"x"}}, "payload.a.b", "must be a JSON value"),
        ({"a": "\udc00"}, "payload.a", "not valid UTF-8"),
        (nested(32), "payload" + ".a" * 32, "nests deeper than 32 levels"),
        (nested(5000), "payload" + ".a" * 32, "nests deeper than 32 levels"),  # was a RecursionError
        ({"a": [[[[1]]]] * 2}, None, None),
    ],
)
def test_payloads_a_struct_cannot_carry_are_refused_naming_the_path(
    payload: dict[Any, Any], field: str | None, rule: str | None
) -> None:
    # A Struct's numbers are doubles: inf and NaN are not JSON, and 2**53 + 1 would arrive as 2**53. A job
    # nested past 32 levels was stored, but GetJob, WatchJob and ListJobs could not carry it back.
    if field is None:
        dict_to_struct(payload)
        return
    with pytest.raises(InvalidArgument) as info:
        dict_to_struct(payload)
    assert info.value.field == field and rule is not None and rule in info.value.rule


def test_integers_up_to_2_53_and_tuples_pass() -> None:
    struct = dict_to_struct({"a": 2**53, "b": -(2**53), "c": (1, 2.5), "d": False})
    assert struct_to_dict(struct) == {"a": 2**53, "b": -(2**53), "c": [1, 2.5], "d": False}


@pytest.mark.parametrize(
    ("fields", "field", "rule"),
    [
        ({"max_attempts": 10**11}, "max_attempts", "must be an integer between -2147483648 and 2147483647"),
        ({"priority": "high"}, "priority", "must be an integer between"),
        ({"thread_demand": 2.5}, "thread_demand", "must be an integer between"),
        ({"timeout_sec": "x"}, "timeout_sec", "must be a number"),
        ({"name": 5}, "name", "must be a string"),
        ({"name": "\udc00"}, "name", "not valid UTF-8"),
        ({"labels": {"team": 1}}, "labels[team]", "must be strings"),
        ({"scheduled_at": 1e20}, "scheduled_at", "between 0001-01-01 and 9999-12-31"),
        # In year 0 and 10000 in UTC, which no datetime holds: an OverflowError traceback before
        (
            {"scheduled_at": datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5)))},
            "scheduled_at",
            "between 0001-01-01",
        ),
        (
            {"scheduled_at": datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone(-timedelta(hours=5)))},
            "scheduled_at",
            "between 0001-01-01 and 9999-12-31 in UTC, got 9999-12-31T23:59:59-05:00",
        ),
    ],
)
def test_job_spec_fields_the_request_cannot_carry_are_named(fields: dict[str, Any], field: str, rule: str) -> None:
    # Not protobuf's unnamed TypeError / ValueError
    with pytest.raises(InvalidArgument) as info:
        JobSpec("noop", **fields).to_proto()
    assert info.value.field == field and rule in info.value.rule


def test_a_batch_names_the_job_at_fault() -> None:
    with pytest.raises(InvalidArgument) as info:
        batch_request([JobSpec("noop"), JobSpec("noop", priority=2**40)])
    assert info.value.field == "jobs[1].priority"
    assert len(batch_request([JobSpec("noop"), JobSpec("sleep", {"seconds": 1})]).jobs) == 2


def test_list_request_names_a_limit_out_of_range() -> None:
    with pytest.raises(InvalidArgument) as info:
        list_request([], "", 2**40, 0)
    assert info.value.field == "limit"
    with pytest.raises(InvalidArgument) as info:
        list_request([], "", 10, "3")  # type: ignore[arg-type]
    assert info.value.field == "offset"


def test_job_spec_sets_only_the_optional_fields_it_has() -> None:
    bare = JobSpec("noop").to_proto()
    assert not bare.HasField("thread_demand") and not bare.HasField("timeout_sec")
    assert not bare.HasField("max_attempts") and not bare.HasField("scheduled_at")

    full = JobSpec(
        "sleep",
        {"seconds": 1},
        name="n",
        priority=5,
        thread_demand=2,
        timeout_sec=3.5,
        max_attempts=4,
        scheduled_at=1_700_000_000.5,
        idempotency_key="key",
        labels={"a": "b"},
    ).to_proto()
    assert (full.thread_demand, full.timeout_sec, full.max_attempts, full.priority) == (2, 3.5, 4, 5)
    assert full.scheduled_at.ToNanoseconds() == 1_700_000_000_500_000_000
    assert dict(full.labels) == {"a": "b"} and full.idempotency_key == "key" and full.name == "n"
    assert struct_to_dict(full.payload) == {"seconds": 1}


def test_job_spec_takes_the_first_and_last_seconds_a_timestamp_holds() -> None:
    first = JobSpec("noop", scheduled_at=datetime(1, 1, 1, tzinfo=UTC)).to_proto()
    last = JobSpec("noop", scheduled_at=datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)).to_proto()
    assert (first.scheduled_at.seconds, last.scheduled_at.seconds) == (-62_135_596_800, 253_402_300_799)


def test_job_spec_times_naive_datetimes_as_utc() -> None:
    naive = JobSpec("noop", scheduled_at=datetime(2030, 1, 2, 3, 4, 5)).to_proto()
    aware = JobSpec("noop", scheduled_at=datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)).to_proto()
    assert naive.scheduled_at == aware.scheduled_at
    with pytest.raises(InvalidArgument):
        JobSpec("noop", scheduled_at="tomorrow").to_proto()  # type: ignore[arg-type]


def test_list_request_takes_states_by_name_or_member() -> None:
    request = list_request(["pending", JobState.FAILED], "sleep", 10, 5)
    assert list(request.status) == [jobs_pb2.Job.PENDING, jobs_pb2.Job.FAILED]
    assert (request.type, request.limit, request.offset) == ("sleep", 10, 5)
    assert list(list_request("running", "", 50, 0).status) == [jobs_pb2.Job.RUNNING]


def test_cluster_values_from_proto() -> None:
    stats = Stats.from_proto(
        jobs_pb2.Stats(queue_depth=3, workers=2, jobs_by_status={"PENDING": 3}, success_rate=0.5, dead_letter=1)
    )
    assert (stats.queue_depth, stats.workers, stats.jobs_by_status, stats.dead_letter) == (3, 2, {"PENDING": 3}, 1)
    worker = WorkerInfo.from_proto(
        admin_pb2.Worker(id="w", state=admin_pb2.Worker.BUSY, threads=4, running_jobs=["a"], last_heartbeat_at=_ts(1))
    )
    assert worker.state is WorkerState.BUSY and worker.running_jobs == ["a"]
    assert worker.registered_at is None and worker.last_heartbeat_at is not None
    assert worker.to_dict()["state"] == "BUSY"
    json.dumps(worker.to_dict())
    json.dumps(stats.to_dict())


def test_unknown_wire_states_become_unspecified() -> None:
    assert JobState.of(99) is JobState.STATE_UNSPECIFIED
    assert WorkerState.of(99) is WorkerState.STATE_UNSPECIFIED
    assert Job.from_proto(jobs_pb2.Job(id="j", state=99)).state is JobState.STATE_UNSPECIFIED  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, "30", True])
def test_a_client_refuses_a_call_timeout_that_would_fail_every_call(bad: Any) -> None:
    for make in (Client, AsyncClient):
        with pytest.raises(InvalidArgument) as info:
            make("127.0.0.1:1", timeout=bad)
        assert info.value.field == "timeout"
    with Client("127.0.0.1:1", timeout=None) as endless, Client("127.0.0.1:1", timeout=2) as two:
        assert endless.timeout is None and two.timeout == 2.0


@pytest.mark.parametrize(("token", "bad"), [("t\u00f6ken-0123456789", "'\u00f6' at character 2"), ("secret-token\n", "'\\n' at character 13"),
                                            ("two words", "' ' at character 4")])  # fmt: skip
def test_a_client_refuses_a_token_grpc_cannot_send(token: str, bad: str) -> None:
    # Each call failed INTERNAL "Invalid metadata", after gRPC core's own error lines on stderr
    for make in (Client, AsyncClient):
        with pytest.raises(InvalidArgument) as info:
            make("127.0.0.1:1", token=token)
        assert info.value.field == "token" and info.value.rule.startswith("must be printable ASCII without spaces")
        assert bad in info.value.rule and token.strip() not in info.value.message  # a credential: never quoted
    with Client("127.0.0.1:1", token="!~printable-ASCII~!") as client:
        assert ("authorization", "Bearer !~printable-ASCII~!") in client.metadata


@pytest.mark.parametrize(
    ("metadata", "rule"),
    [
        ([("x-request-id", "caf\u00e9")], "'x-request-id': the value must be printable ASCII"),
        ([("x-request-id", "a\nb")], "got '\\n' at character 2"),
        ([("X-Request-Id", "abc")], "entry 1: a key must be lowercase ASCII"),
        ([("ok", "1"), ("x id", "abc")], "entry 2: a key must be lowercase ASCII"),
        ([("", "abc")], "entry 1: a key must be lowercase"),
        ([("x-trace-bin", "text")], "'x-trace-bin': a key ending in '-bin' takes bytes, got str"),
        ([("x-n", 5)], "'x-n': the value must be a string, got int"),
        ([("x-n",)], "entry 1 must be a (key, value) pair"),
    ],
)
def test_a_client_refuses_metadata_grpc_cannot_send(metadata: Any, rule: str) -> None:
    # gRPC failed each call INTERNAL "Invalid metadata", or raised a bare TypeError at the first call
    for make in (Client, AsyncClient):
        with pytest.raises(InvalidArgument) as info:
            make("127.0.0.1:1", metadata=metadata)
        assert info.value.field == "metadata" and rule in info.value.rule


def test_a_client_sends_metadata_grpc_can_send_and_one_authorization() -> None:
    fine: list[tuple[str, str | bytes]] = [("x-request-id", "abc 123 ~!"), ("x-trace-bin", b"\xff\x00"), ("x_y.z", "")]
    with Client("127.0.0.1:1", metadata=fine, token="t" * 20) as client:
        assert client.metadata == (*fine, ("authorization", "Bearer " + "t" * 20))
    with pytest.raises(InvalidArgument) as info:
        Client("127.0.0.1:1", metadata=[("authorization", "Bearer x")], token="t" * 20)
    assert info.value.field == "metadata" and "not hold 'authorization' when a token is given" in info.value.rule
    with Client("127.0.0.1:1", metadata=[("authorization", "Bearer " + "t" * 20)]) as client:
        assert client.metadata == (("authorization", "Bearer " + "t" * 20),)


def test_requests_by_id_name_an_id_that_is_not_a_string() -> None:
    assert by_id(jobs_pb2.GetJobRequest, "abc").id == "abc"
    with pytest.raises(InvalidArgument) as info:
        by_id(admin_pb2.DrainWorkerRequest, 5)  # type: ignore[arg-type]
    assert info.value.field == "id" and "must be a string" in info.value.rule
