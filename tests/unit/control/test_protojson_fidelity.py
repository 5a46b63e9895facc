"""protojson at the edges: numbers beyond a double named by their field, unknown enum numbers in a query
named by their element, and negative zero written as Go's protojson writes it."""

from __future__ import annotations

import json
import math
import re

import pytest

from control.gateway import protojson
from corral.errors import InvalidArgument
from corral.v1 import admin_pb2, jobs_pb2
from tests.support.signs import signs

BIG = "9" * 400
"""An integer literal beyond a double's range."""


def refused(body: bytes, cls: type = jobs_pb2.SubmitJobRequest) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as info:
        protojson.to_message(protojson.loads(body), cls())
    return info.value


# ---- numbers beyond a double -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"payload": {"x": 1E400}}', "payload.x"),
        (b'{"payload": {"x": -1E400}}', "payload.x"),
        (b'{"payload": {"x": [0, -1e999]}}', "payload.x[1]"),
        (b'{"payload": {"a": {"b": [{"c": 2e308}]}}}', "payload.a.b[0].c"),
        (b'{"payload": {"a": [[1], [2, [3, 4e400]]]}}', "payload.a[1][1][1]"),
        (b'{"timeoutSec": 1e400}', "timeout_sec"),
        (b'{"timeout_sec": -' + BIG.encode() + b"}", "timeout_sec"),  # was OverflowError: a 500
        (b'{"priority": 1E400}', "priority"),
        (b'{"startWhen": 1E400}', "start_when"),
        (b'{"labels": {"k": 1E400}}', "labels.k"),
        (b'{"scheduledAt": 1E400}', "scheduled_at"),
        (b'{"payload": 1E400}', "payload"),
    ],
)
def test_a_number_beyond_a_double_is_named_by_its_field(body: bytes, field: str) -> None:
    # It was refused by the decoder, naming no field: "request body is not valid JSON: number 1E400 is out of range"
    err = refused(body)
    assert err.field == field and "beyond what a double can hold" in err.rule, (err.field, err.rule)


def test_beyond_a_double_in_batches_and_other_messages() -> None:
    err = refused(b'{"jobs": [{"type": "noop"}, {"payload": {"x": [1e400]}}]}', jobs_pb2.SubmitJobsRequest)
    assert err.field == "jobs[1].payload.x[0]"
    assert refused(b'{"weight": 1e400}', admin_pb2.Share).field == "weight"
    # A long literal is shortened in the message
    assert "(401 characters)" in refused(b'{"timeoutSec": 1' + b"0" * 400 + b"}").rule


def test_numbers_a_double_holds_pass() -> None:
    message = jobs_pb2.SubmitJobRequest()
    protojson.to_message(protojson.loads(b'{"payload": {"max": 1.7976931348623157e308, "tiny": 5e-324, '
                                         b'"under": -1e-400}, "timeoutSec": 1e300}'), message)  # fmt: skip
    assert message.payload["max"] == 1.7976931348623157e308 and message.payload["under"] == 0
    assert message.timeout_sec == 1e300
    # The protojson words for a double field still mean infinity, as protojson reads them
    protojson.to_message({"timeoutSec": "Infinity"}, message)
    assert message.timeout_sec == math.inf


def test_loads_hands_a_number_beyond_a_double_on() -> None:
    value = protojson.loads(b'{"a": [1E400]}')
    assert isinstance(value["a"][0], protojson.Beyond) and value["a"][0].text == "1E400"
    assert protojson.loads_many(b'{"a": -1e999}')[0]["a"].text == "-1e999"


# ---- unknown enum numbers in a query ---------------------------------------------------------------
LIST_FIELDS = list(jobs_pb2.ListJobsRequest.DESCRIPTOR.fields)


@pytest.mark.parametrize(
    ("pairs", "field"),
    [
        ([("status", "99")], "status[0]"),
        ([("status", "PENDING"), ("status", "99")], "status[1]"),
        ([("status", "1"), ("status", "2"), ("status", "-1")], "status[2]"),
        ([("status", "99999999999")], "status[0]"),
        ([("order", "7")], "order"),
    ],
)
def test_an_unknown_enum_number_in_a_query_is_named_by_its_element(pairs: list[tuple[str, str]], field: str) -> None:
    # It went on to the service, which named "status" for every element
    with pytest.raises(InvalidArgument) as info:
        protojson.query_to_json(pairs, LIST_FIELDS, "ListJobsRequest")
    assert info.value.field == field and "unknown value" in info.value.rule and " (1)" in info.value.rule


def test_known_enum_numbers_and_names_in_a_query_pass() -> None:
    value = protojson.query_to_json([("status", "2"), ("status", "SUCCEEDED"), ("order", "1")], LIST_FIELDS, "L")
    assert value == {"status": [2, "SUCCEEDED"], "order": 1}
    # A name the enum does not list is named by its element, as before (by to_message)
    with pytest.raises(InvalidArgument) as info:
        protojson.to_message(protojson.query_to_json([("status", "2"), ("status", "DONE")], LIST_FIELDS, "L"),
                             jobs_pb2.ListJobsRequest())  # fmt: skip
    assert info.value.field == "status[1]"


# ---- negative zero ---------------------------------------------------------------------------------


def test_a_negative_zero_keeps_its_sign_and_is_written_as_go_writes_it() -> None:
    # It came out as 0: the sign was lost turning integral doubles into ints
    job = jobs_pb2.Job(id="j")
    job.result.update({"z": -0.0, "zs": [-0.0, 0.0, {"deep": -0.0}], "one": -1.0, "small": -0.05})
    out = protojson.to_json(job)
    assert signs(out["result"]) == {"z": -1.0, "zs": [-1.0, 1.0, {"deep": -1.0}], "one": -1.0, "small": -1.0}
    assert out["result"]["one"] == -1 and isinstance(out["result"]["one"], int)  # as before
    body = protojson.dumps(out)
    assert re.search(rb'"z":-0[,}]', body) and b'"zs":[-0,0,{"deep":-0}]' in body and b'"small":-0.05' in body
    assert signs(json.loads(body, parse_int=float)["result"]) == signs(out["result"])


def test_negative_zero_text_in_strings_is_left_alone() -> None:
    # Strings that hold "-0.0", or the marker the encoder uses, are written as they are
    value = {"s": "-0.0", "t": "a -0.0, b", "n": -0.0, "m": "\x00-0 0\x00", "\x00-0 1\x00": [-0.0]}
    body = protojson.dumps(value)
    assert json.loads(body) == {"s": "-0.0", "t": "a -0.0, b", "n": 0, "m": "\x00-0 0\x00", "\x00-0 1\x00": [0]}
    assert b'"n":-0,' in body and b":[-0]}" in body
    assert protojson.dumps({"s": "-0.0", "x": -0.05}) == b'{"s":"-0.0","x":-0.05}'
    assert protojson.dumps({"x": 0.0, "y": 0}) == b'{"x":0.0,"y":0}'  # only negative zero changes
