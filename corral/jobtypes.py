"""The payload contract of the built-in job types.

Each built-in type declares the JSON Schema (draft 2020-12) its payload must satisfy. The control
plane validates every submission against it (so a bad payload is refused at submit time, naming the
field, and never reaches a worker); the runner registers its implementation under the same name.
Plug-in types bring their own schema, which workers advertise when they register.

Numbers in payloads travel as JSON numbers: integers are exact up to 2**53.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

_INT = {"type": "integer"}
_DIM = {"type": "integer", "minimum": 1, "maximum": 16384}

BUILTIN_SCHEMAS: dict[str, Schema] = {
    "noop": {"type": "object"},
    "sleep": {
        "type": "object",
        "properties": {"seconds": {"type": "number", "minimum": 0, "maximum": 86400}},
        "required": ["seconds"],
        "additionalProperties": False,
    },
    "add_numbers": {
        "type": "object",
        "properties": {"a": _INT, "b": _INT},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
    "reverse_string": {
        "type": "object",
        "properties": {"text": {"type": "string", "maxLength": 1_000_000}},
        "required": ["text"],
        "additionalProperties": False,
    },
    "large_array_sum": {
        "type": "object",
        "properties": {"numbers": {"type": "array", "items": _INT}},
        "required": ["numbers"],
        "additionalProperties": False,
    },
    "resize_image": {
        "type": "object",
        "properties": {
            "width": _DIM,
            "height": _DIM,
            "channels": {"enum": [1, 3, 4]},
            "target_width": _DIM,
            "target_height": _DIM,
            "method": {"enum": ["bilinear", "area"]},
            # Raw row-major uint8 pixels, base64; absent -> a deterministic test pattern.
            "pixels_b64": {"type": "string", "contentEncoding": "base64"},
            "return_pixels": {"type": "boolean"},
        },
        "required": ["width", "height", "target_width", "target_height"],
        "additionalProperties": False,
    },
    "cpu_intensive": {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 1_000_000_000}},
        "required": ["n"],
        "additionalProperties": False,
    },
    "failing": {
        "type": "object",
        "properties": {
            "message": {"type": "string", "maxLength": 10_000},
            # Fail the first k attempts, then succeed; absent -> fail every attempt.
            "fail_attempts": {"type": "integer", "minimum": 0},
        },
        "additionalProperties": False,
    },
}
"""Built-in job type name -> payload JSON Schema."""
