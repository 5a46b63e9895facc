"""The encoded-size bound on a payload (control.api.convert.check_encoded_payload): a payload it refuses
must be over the JSON limit, whatever its shape, since it refuses before anything is converted."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from google.protobuf import struct_pb2

from control.api.convert import (
    ENCODED_PER_JSON_BYTE,
    ENCODED_SLACK_BYTES,
    check_encoded_payload,
    struct_to_dict,
)
from corral.errors import InvalidArgument


def _json_bytes(payload: struct_pb2.Struct) -> int:
    """What the size rule measures (control.admission.validation.validate)."""
    return len(json.dumps(struct_to_dict(payload), separators=(",", ":"), ensure_ascii=False).encode())


def _struct(value: dict[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(value)
    return out


def _nested_lists(depth: int) -> dict[str, Any]:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return {"": value}


def _nested_objects(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"": value}
    return value


WORST_SHAPES: dict[str, dict[str, Any]] = {
    "numbers in a list": {"x": [1] * 10_000},
    "zeros in a list": {"": [0] * 10_000},
    "negative zeros": {"": [-0.0] * 10_000},
    "one number": {"": 1},
    "a list of one number": {"": [1]},
    "numbers under short keys": {chr(0x21 + i % 90) * (1 + i // 90): i % 10 for i in range(5_000)},
    "empty key": {"": 0},
    "nulls and bools": {"": [None, True, False] * 3_000},
    "empty strings": {"": [""] * 10_000},
    "empty lists": {"": [[]] * 10_000},
    "empty objects": {"": [{}] * 10_000},
    "lists of one number": {"": [[1]] * 10_000},
    "deep lists": _nested_lists(45),
    "deep objects": _nested_objects(45),
    "a long string": {"s": "x" * 300_000},
    "deep lists around many numbers": {"": [[[[[[1] * 20_000]]]]]},
}


@pytest.mark.parametrize("shape", WORST_SHAPES)
def test_no_shape_takes_more_encoded_bytes_than_the_bound_allows(shape: str) -> None:
    # Given a payload of a shape that is dense when encoded
    payload = _struct(WORST_SHAPES[shape])
    # Then its encoded size is within the bound of its JSON size
    assert payload.ByteSize() <= _json_bytes(payload) * ENCODED_PER_JSON_BYTE + ENCODED_SLACK_BYTES


def _random_value(rng: random.Random, depth: int) -> Any:
    kind = rng.randrange(7 if depth < 6 else 5)
    if kind == 0:
        return rng.choice([0, 1, -1, 7, 0.5, 1e300, -2.5e-300])
    if kind == 1:
        return rng.choice(["", "a", "é", "\x00", '"\\'])
    if kind in (2, 3):
        return rng.choice([None, True, False])
    if kind == 4:
        return rng.randrange(10)
    if kind == 5:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(8))]
    return {rng.choice(["", "k", "é", str(i)]) + str(i): _random_value(rng, depth + 1) for i in range(rng.randrange(6))}


def test_random_payloads_stay_within_the_bound() -> None:
    rng = random.Random(20240611)
    for _ in range(500):
        payload = _struct({str(i): _random_value(rng, 0) for i in range(rng.randrange(1, 6))})
        assert payload.ByteSize() <= _json_bytes(payload) * ENCODED_PER_JSON_BYTE + ENCODED_SLACK_BYTES


def test_a_payload_over_the_bound_is_refused_naming_the_field_and_the_limit() -> None:
    # Given a payload whose JSON (2 bytes a number) is about twice the limit of 100,000 bytes
    payload = _struct({"x": [1] * 100_000})
    # When it is checked, Then it is refused before it is converted, naming the field and the rule
    with pytest.raises(InvalidArgument) as caught:
        check_encoded_payload(payload, 100_000, "jobs[2].payload")
    assert caught.value.field == "jobs[2].payload"
    assert "the limit is 100000 bytes" in caught.value.rule
    least = int(caught.value.rule.split("at least ")[1].split(" ")[0])
    assert 100_000 < least <= _json_bytes(payload)


def test_a_payload_at_the_limit_passes_with_its_size() -> None:
    # Given the densest payload whose JSON is exactly at the limit
    payload = _struct({"x": [1] * 10_000})
    limit = _json_bytes(payload)
    # Then the bound lets it through (the exact rule is checked later, on its JSON)
    assert check_encoded_payload(payload, limit, "payload") == payload.ByteSize()
