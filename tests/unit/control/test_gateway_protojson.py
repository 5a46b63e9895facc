"""protojson in and out: strict JSON, both field spellings, errors naming the field by its proto path."""

from typing import Any

import pytest

from control.gateway import protojson
from corral.errors import InvalidArgument
from corral.v1 import admin_pb2, jobs_pb2


def parse(value: Any, cls: type = jobs_pb2.SubmitJobRequest) -> Any:
    message = cls()
    protojson.to_message(value, message)
    return message


def refused(value: Any, cls: type = jobs_pb2.SubmitJobRequest) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as info:
        parse(value, cls)
    return info.value


def test_both_spellings_and_protojson_forms_are_accepted() -> None:
    req = parse({"type": "noop", "threadDemand": "4", "timeout_sec": "1.5", "maxAttempts": 2.0,
                 "scheduledAt": "2030-01-02T03:04:05Z", "payload": {"a": [1, {"b": None}]}, "labels": {"k": "v"}})  # fmt: skip
    assert req.thread_demand == 4 and req.timeout_sec == 1.5 and req.max_attempts == 2
    assert req.scheduled_at.seconds > 0 and req.labels["k"] == "v" and req.payload["a"][1]["b"] is None
    assert parse({"status": ["PENDING", 3]}, jobs_pb2.ListJobsRequest).status == [2, 3]
    assert parse({"type": None}).type == ""  # null is the default


@pytest.mark.parametrize(
    ("value", "field", "words"),
    [
        ({"tipe": "noop"}, "tipe", "unknown field of SubmitJobRequest"),
        ({"priority": "high"}, "priority", "must be an integer"),
        ({"priority": True}, "priority", "must be an integer"),
        ({"priority": 2**31}, "priority", "between"),
        ({"timeoutSec": "soon"}, "timeout_sec", "must be a number"),
        ({"name": 5}, "name", "must be a string"),
        ({"labels": []}, "labels", "a map"),
        ({"labels": {"k": 1}}, "labels.k", "must be a string"),
        ({"payload": "x"}, "payload", "JSON object"),
        ({"scheduledAt": 5}, "scheduled_at", "RFC 3339"),
        ({"scheduledAt": "10000-01-01T00:00:00Z"}, "scheduled_at", "RFC 3339"),
        ({"type": "\ud800"}, "type", "unpaired surrogate"),
        ({"maxAttempts": 1, "max_attempts": 2}, "max_attempts", "given twice"),
    ],
)
def test_bad_fields_are_named(value: dict[str, Any], field: str, words: str) -> None:
    err = refused(value)
    assert err.field == field and words in err.rule


@pytest.mark.parametrize(
    ("value", "cls", "field"),
    [
        ({"startWhen": 99999999999}, jobs_pb2.SubmitJobRequest, "start_when"),
        ({"startWhen": -(2**31) - 1}, jobs_pb2.SubmitJobRequest, "start_when"),
        ({"status": ["PENDING", 2**31]}, jobs_pb2.ListJobsRequest, "status[1]"),
    ],
)
def test_an_enum_number_beyond_int32_is_refused_naming_the_field(value: Any, cls: type, field: str) -> None:
    # It was protobuf's own "Value out of range", naming no field
    err = refused(value, cls)
    assert err.field == field and "must be an enum name or a number between -2147483648 and 2147483647" in err.rule
    # An unknown number within int32 passes, as protobuf keeps it (open enums)
    assert parse({"startWhen": 2**31 - 1}).start_when == 2**31 - 1


def test_query_bytes_that_are_not_utf8_are_refused_naming_the_parameter() -> None:
    protojson.check_query_text("type=%C3%A9&labels%5Bk%5D=%EF%BF%BD&limit=5&x")  # é and U+FFFD itself pass
    for raw, field in [("type=%ff", "type"), ("limit=1&labels[t%C3%A9am]=a%fe+b", "labels[téam]"), ("%fe=1", "%fe")]:
        with pytest.raises(InvalidArgument) as info:
            protojson.check_query_text(raw)
        assert info.value.field == field and "not valid UTF-8" in info.value.rule


def test_nested_paths_use_proto_names_and_indexes() -> None:
    err = refused({"jobs": [{"type": "noop"}, {"threadDemand": "x"}]}, jobs_pb2.SubmitJobsRequest)
    assert err.field == "jobs[1].thread_demand"
    err = refused({"status": ["PENDING", "DONE"]}, jobs_pb2.ListJobsRequest)
    assert err.field == "status[1]" and "one of STATE_UNSPECIFIED" in err.rule
    assert refused({"jobs": {}}, jobs_pb2.SubmitJobsRequest).field == "jobs"
    assert refused({"jobs": [None]}, jobs_pb2.SubmitJobsRequest).field == "jobs[0]"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"\xff{}", "not valid UTF-8 (byte 0)"),
        (b"{", "not valid JSON"),
        (b'{"a": NaN}', "NaN is not JSON"),
        (b'{"a": -Infinity}', "is not JSON"),
        (b'{"a": 1, "a": 2}', "duplicate key 'a'"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ],
)
def test_bodies_must_be_strict_json(body: bytes, words: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        protojson.loads(body)
    assert words in info.value.rule and info.value.field == ""


def test_query_strings_map_onto_fields() -> None:
    fields = list(jobs_pb2.ListJobsRequest.DESCRIPTOR.fields)
    value = protojson.query_to_json([("status", "PENDING"), ("status", "2"), ("limit", "5")], fields, "ListJobsRequest")
    assert value == {"status": ["PENDING", 2], "limit": "5"}
    assert parse(value, jobs_pb2.ListJobsRequest).limit == 5
    for pairs, field in [([("colour", "red")], "colour"), ([("limit", "1"), ("limit", "2")], "limit"),
                         ([("limit.x", "1")], "limit.x")]:  # fmt: skip
        with pytest.raises(InvalidArgument) as info:
            protojson.query_to_json(pairs, fields, "ListJobsRequest")
        assert info.value.field == field


def test_a_map_s_entries_are_written_name_key_in_a_query() -> None:
    fields = list(jobs_pb2.ListJobsRequest.DESCRIPTOR.fields)
    pairs = [("labels[team]", "edge"), ('labels[a.b "c" [0]]', "ü"), ("labels[]", "empty key")]
    value = protojson.query_to_json(pairs, fields, "ListJobsRequest")
    assert value == {"labels": {"team": "edge", 'a.b "c" [0]': "ü", "": "empty key"}}
    assert dict(parse(value, jobs_pb2.ListJobsRequest).labels) == value["labels"]
    for bad, rule in [
        ([("labels[team]", "a"), ("labels[team]", "b")], "given more than once"),
        ([("labels[team", "a")], "write a map's entry as labels[key]=value"),
        ([("labels[a]b", "a")], "write a map's entry as labels[key]=value"),
        ([("limit[x]", "1")], "limit is not a map"),
        ([("colour[x]", "1")], "is not a query parameter of ListJobsRequest"),
    ]:
        with pytest.raises(InvalidArgument) as info:
            protojson.query_to_json(bad, fields, "ListJobsRequest")
        assert info.value.field == bad[-1][0] and rule in info.value.rule


def test_output_is_lower_camel_case_with_defaults_and_int64_strings() -> None:
    job = jobs_pb2.Job(id="j", state=jobs_pb2.Job.SUCCEEDED, timeout_sec=30.0, thread_demand=2)
    job.result.update({"sum": 3, "half": 0.5})
    out = protojson.to_json(job)
    assert out["state"] == "SUCCEEDED" and out["threadDemand"] == 2 and out["timeoutSec"] == 30
    assert out["result"] == {"sum": 3, "half": 0.5} and out["attempts"] == 0 and "startedAt" not in out
    assert protojson.to_json(jobs_pb2.ListJobsResponse(total=7)) == {"jobs": [], "total": "7"}
    assert protojson.to_json(admin_pb2.Worker(jobs_completed=2))["jobsCompleted"] == "2"
    assert protojson.dumps({"a": "é"}) == '{"a":"é"}'.encode()


def test_a_streamed_body_is_json_values_one_after_another() -> None:
    # Newline-delimited, back to back, spread over lines, or none at all
    assert protojson.loads_many(b'{"a": 1}\n{"b": 2}\n') == [{"a": 1}, {"b": 2}]
    assert protojson.loads_many(b'{"a": 1}{"b": 2}') == [{"a": 1}, {"b": 2}]
    assert protojson.loads_many(b'  {\n "a": 1\n}\r\n\t{"b":\n 2}  ') == [{"a": 1}, {"b": 2}]
    assert protojson.loads_many(b"") == [] and protojson.loads_many(b" \n ") == []
    # A value that is not strict JSON is named by its place, and nothing is returned
    for body, words in ((b'{"a": 1}\n{"a": NaN}', "(value 1)"), (b'{"a": 1} {"a": 1, "a": 2}', "duplicate key"),
                        (b'{"a": 1}\n{"a":', "(value 1)"), (b"\xff", "UTF-8")):  # fmt: skip
        with pytest.raises(InvalidArgument) as info:
            protojson.loads_many(body)
        assert words in info.value.rule, info.value.rule
