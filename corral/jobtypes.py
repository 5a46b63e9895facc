"""The payload contract of the built-in job types.

Each built-in type declares the JSON Schema (draft 2020-12) its payload must satisfy. The control
plane validates every submission against it (so a bad payload is refused at submit time, naming the
field, and never reaches a worker); the runner registers its implementation under the same name.
Plug-in types bring their own schema, which workers advertise when they register.

Numbers in payloads travel as JSON numbers inside a ``google.protobuf.Struct``, that is as doubles:
integers are exact up to 2**53, which is why seeds are bounded there. Large numeric arrays travel as
the base64 of an ``.npy`` file (``array_b64``, ``a_b64``, ``b_b64``); such payloads are far beyond the
default ``CORRAL_MAX_PAYLOAD_BYTES`` (1 MiB of JSON): a 1,000,000-element int64 array is ~10.7 MB, so
the operator raises that limit (up to 64 MiB) for control planes that take such jobs.

What a schema cannot say is checked by the runner when the job runs (``INVALID_PAYLOAD``): the
dtype and shape inside an ``.npy`` header, that ``pixels_b64`` holds ``width * height * channels``
bytes, that a PNG decodes.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

MAX_JSON_DEPTH = 32
"""How many levels of objects and arrays a payload or a result may have (the top object is level 1).
Messages are parsed with a depth limit, and a job nested much deeper could be stored but never read
back: GetJob, WatchJob and ListJobs carry it a level or two deeper than SubmitJob."""


_NESTS = (dict, list, tuple)


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> str | None:
    """The path (``.a.b[0]``) of the first object or array deeper than ``limit`` levels in ``value``, or
    None. Iterative, so a value nested thousands deep is answered, not a RecursionError."""
    stack: list[tuple[Any, int, str]] = [(value, 1, "")]
    while stack:
        node, depth, path = stack.pop()
        if depth > limit:
            return path
        if isinstance(node, dict):
            stack.extend((v, depth + 1, f"{path}.{k}") for k, v in node.items() if isinstance(v, _NESTS))
        elif isinstance(node, list | tuple):
            stack.extend((v, depth + 1, f"{path}[{i}]") for i, v in enumerate(node) if isinstance(v, _NESTS))
    return None


MAX_EXACT_INTEGER = 2**53
"""The largest integer magnitude a payload or result number (a double in a ``Struct``) carries exactly.
Clients and the control plane refuse payload integers beyond it rather than let them arrive rounded."""

_INT = {"type": "integer"}
_DIM = {"type": "integer", "minimum": 1, "maximum": 16384}
_INT64 = {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}
_SEED = {"type": "integer", "minimum": 0, "maximum": 2**53}
_BASE64 = r"[A-Za-z0-9+/]*={0,2}$"
_NPY_B64 = {
    "type": "string",
    "pattern": "^k05VTVBZ" + _BASE64,  # base64 of the magic string \x93NUMPY that opens every .npy file
    "contentEncoding": "base64",
    "contentMediaType": "application/x-npy",
}
_URL = {"type": "string", "minLength": 8, "maxLength": 2048, "pattern": r"^https?://[^\s/?#]+[^\s]*$"}
_TIMEOUT = {"type": "number", "exclusiveMinimum": 0, "maximum": 3600}
_EMAIL = {"type": "string", "minLength": 3, "maxLength": 254, "pattern": r"^[^@\s<>,;]+@[^@\s<>,;]+$"}
_ONE_LINE = r"^[^\r\n]*$"
# Refuses any value; the description is there for the error message ("... should not be valid under ...").
_NOT_WITH_PNG = {"not": {"description": "a PNG gives its own size and channels"}}

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
        "properties": {
            # Exactly one of: a JSON list (items by dtype, below) or a 1-D int64/float64 .npy file.
            "numbers": {"type": "array"},
            "array_b64": _NPY_B64,
            # How to read "numbers" (default int64); with array_b64 it must match the .npy header.
            "dtype": {"enum": ["int64", "float64"]},
            # An int64 sum beyond the int64 range: "exact" returns it (a big integer), "error" fails OVERFLOW.
            "on_overflow": {"enum": ["exact", "error"]},
        },
        "oneOf": [{"required": ["numbers"]}, {"required": ["array_b64"]}],
        "if": {"required": ["dtype"], "properties": {"dtype": {"const": "float64"}}},
        "then": {"properties": {"numbers": {"items": {"type": "number"}}}},
        "else": {"properties": {"numbers": {"items": _INT64}}},
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
            # Raw row-major uint8 pixels, base64; absent (and no png_b64) -> a deterministic test pattern.
            "pixels_b64": {"type": "string", "pattern": "^" + _BASE64, "contentEncoding": "base64"},
            # A PNG file, base64 ("iVBORw0KGgo" is its signature); its header gives the size and channels.
            "png_b64": {
                "type": "string",
                "pattern": "^iVBORw0KGgo" + _BASE64,
                "contentEncoding": "base64",
                "contentMediaType": "image/png",
            },
            "return_pixels": {"type": "boolean"},
            # The form of the returned image: "raw" (pixels_b64) or "png" (png_b64); default: as given.
            "output_format": {"enum": ["raw", "png"]},
        },
        "required": ["target_width", "target_height"],
        "if": {"required": ["png_b64"]},
        "then": {"properties": {k: _NOT_WITH_PNG for k in ("width", "height", "channels", "pixels_b64")}},
        "else": {"required": ["width", "height"]},
        "additionalProperties": False,
    },
    "cpu_intensive": {
        "type": "object",
        "properties": {
            # Count the primes <= n (a segmented sieve) ...
            "n": {"type": "integer", "minimum": 1, "maximum": 100_000_000_000},
            # ... or run 64 chains of `rounds` SplitMix64 rounds from `seed` (cost: 64 * rounds rounds).
            "rounds": {"type": "integer", "minimum": 0, "maximum": 10_000_000_000},
            "seed": _SEED,
        },
        "oneOf": [{"required": ["n"]}, {"required": ["rounds"]}],
        "dependentRequired": {"seed": ["rounds"]},
        "additionalProperties": False,
    },
    "matmul": {
        "type": "object",
        "properties": {
            # Generated: an (m x k) times a (k x n) matrix of seeded uniform values in [-1, 1) ...
            "n": {"type": "integer", "minimum": 1, "maximum": 8192},
            "m": {"type": "integer", "minimum": 1, "maximum": 8192},
            "k": {"type": "integer", "minimum": 1, "maximum": 8192},
            "seed": _SEED,
            # ... or given: two 2-D float64 .npy files whose shapes multiply.
            "a_b64": _NPY_B64,
            "b_b64": _NPY_B64,
            "return_matrix": {"type": "boolean"},
        },
        "oneOf": [{"required": ["n"]}, {"required": ["a_b64", "b_b64"]}],
        "dependentRequired": {"m": ["n"], "k": ["n"], "seed": ["n"], "a_b64": ["b_b64"], "b_b64": ["a_b64"]},
        "additionalProperties": False,
    },
    "monte_carlo_pi": {
        "type": "object",
        "properties": {
            "samples": {"type": "integer", "minimum": 1, "maximum": 1_000_000_000_000},
            "seed": _SEED,
        },
        "required": ["samples"],
        "additionalProperties": False,
    },
    "io_intensive": {
        "type": "object",
        "properties": {
            "size_bytes": {"type": "integer", "minimum": 0, "maximum": 1 << 36},
            "block_bytes": {"type": "integer", "minimum": 512, "maximum": 64 << 20},
            "seed": _SEED,
            "fsync": {"type": "boolean"},
        },
        "required": ["size_bytes"],
        "additionalProperties": False,
    },
    "network_intensive": {
        "type": "object",
        "properties": {
            "url": _URL,
            "timeout_sec": _TIMEOUT,
            "max_bytes": {"type": "integer", "minimum": 0, "maximum": 1 << 40},
        },
        "required": ["url"],
        "additionalProperties": False,
    },
    "webhook": {
        "type": "object",
        "properties": {
            "url": _URL,
            "method": {"enum": ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"]},
            "headers": {
                "type": "object",
                "maxProperties": 100,
                "propertyNames": {"pattern": r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$"},
                "additionalProperties": {"type": "string", "maxLength": 8192, "pattern": _ONE_LINE},
            },
            # A string is sent as it is; any other JSON value is sent as JSON (application/json).
            "body": {"type": ["string", "object", "array", "number", "boolean", "null"]},
            "timeout_sec": _TIMEOUT,
        },
        "required": ["url"],
        "additionalProperties": False,
    },
    "email": {
        "type": "object",
        "properties": {
            "to": {"oneOf": [_EMAIL, {"type": "array", "items": _EMAIL, "minItems": 1, "maxItems": 100}]},
            "subject": {"type": "string", "maxLength": 998, "pattern": _ONE_LINE},
            "body": {"type": "string", "maxLength": 1_000_000},
            "from": _EMAIL,
        },
        "required": ["to", "subject", "body"],
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
