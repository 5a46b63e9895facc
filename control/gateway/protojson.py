"""protojson for the REST bridge: JSON in, checked with the offending field named; JSON out.

In: strict JSON (UTF-8, no ``NaN`` literals, no duplicate keys) whose fields may be spelled either
way (``timeoutSec`` or ``timeout_sec``), as grpc-gateway v2 accepts them. Unknown fields, wrong types,
out-of-range numbers (a number beyond a double, ``1E400``, too), unknown enum names and, in a query
string, unknown enum numbers are refused with :class:`~corral.errors.InvalidArgument` naming the field
by its proto path (``jobs[2].priority``, ``payload.x[1]``, ``status[1]``), the same path the gRPC API
uses. Query strings map onto the same rules (:func:`query_to_json`), once :func:`check_query_text` has
found their percent-encoded bytes to be UTF-8.

Out: lowerCamelCase names, enums by name, 64-bit integers as strings, scalars at their defaults
included (unset message fields left out), integral numbers without a fractional part and negative
zero as ``-0`` (as Go's protojson prints them).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import math
import re
import urllib.parse
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from google.protobuf import duration_pb2, json_format, timestamp_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from control.api.convert import plain
from corral.errors import InvalidArgument
from corral.job import check_json_value
from corral.limits import PROTO_INT_RANGES

_INTEGER = re.compile(r"^-?[0-9]+$")
_FLOAT_WORDS = {"NaN", "Infinity", "-Infinity"}
_FLOAT32_MAX = 3.4028234663852886e38
_WRAPPERS = {
    f"google.protobuf.{n}Value"
    for n in ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes")
}
_ANY_JSON = {"google.protobuf.Value"}
_STRUCT_JSON = {"google.protobuf.Value", "google.protobuf.Struct", "google.protobuf.ListValue"}
_OBJECT_JSON = {"google.protobuf.Struct", "google.protobuf.Any", "google.protobuf.Empty"}
_SCALARS = frozenset({int, float, str, bool, type(None)})
"""The types of the JSON values that hold no key."""
_NOT_UTF8 = "is not valid UTF-8 (an unpaired surrogate): a JSON string must be valid UTF-8, and lone surrogates are not"


# ---- bytes -> JSON value ---------------------------------------------------------------------------
def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


class Beyond:
    """A JSON number beyond what a double can hold (``1E400``, ``-1e999``), as :func:`loads` hands it on:
    refused by :func:`to_message`, which knows the field to name (``payload.x``), where the decoder
    knew only the line and column."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text
        """The number as the body wrote it."""

    def __repr__(self) -> str:
        return f"Beyond({self.text!r})"

    def refused(self, path: str) -> InvalidArgument:
        """The error that names ``path``."""
        text = self.text if len(self.text) <= 40 else f"{self.text[:20]}... ({len(self.text)} characters)"
        return InvalidArgument(path, f"is out of range: {text} is beyond what a double can hold (about ±1.8e308)")


def _number(text: str) -> float | Beyond:
    """A JSON number with a fraction or an exponent: a double, or :class:`Beyond` when it overflows one
    (JSON's grammar has no NaN, so only an overflow is not finite; one that underflows is 0, as Go's
    ``strconv.ParseFloat`` takes it)."""
    value = float(text)
    return value if math.isfinite(value) else Beyond(text)


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_number, object_pairs_hook=_unique)
_SPACE = re.compile(r"[ \t\n\r]*")


def _text(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgument("", f"request body is not valid UTF-8 (byte {exc.start})") from None


def loads(body: bytes) -> Any:
    """The JSON value of a request body; InvalidArgument naming the problem when it is not strict JSON. A
    number beyond a double is a :class:`Beyond`, which :func:`to_message` refuses naming its field."""
    text = _text(body)
    with _json_errors(""):
        return _DECODER.decode(text)


def loads_many(body: bytes) -> list[Any]:
    """The JSON values of a request body that streams messages (a client-streaming RPC, as grpc-gateway
    reads one): values one after another, separated by whitespace or nothing (newline-delimited JSON is
    one such body); InvalidArgument names the value and the problem when one is not strict JSON."""
    text = _text(body)
    values: list[Any] = []
    pos = _SPACE.match(text, 0).end()  # type: ignore[union-attr]  # matches the empty string too
    while pos < len(text):
        with _json_errors(f" (value {len(values)})"):
            value, pos = _DECODER.raw_decode(text, pos)
        values.append(value)
        pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]
    return values


@contextlib.contextmanager
def _json_errors(which: str) -> Iterator[None]:
    """Raise what the body breaks as InvalidArgument; ``which``: the value's place, for a stream of them."""
    try:
        yield
    except json.JSONDecodeError as exc:
        raise InvalidArgument(
            "", f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}{which}"
        ) from None
    except ValueError as exc:
        raise InvalidArgument("", f"request body is not valid JSON: {exc}{which}") from None
    except RecursionError:
        raise InvalidArgument("", f"request body is nested too deeply{which}") from None


# ---- JSON value -> message -------------------------------------------------------------------------
def to_message(value: Any, message: Message, max_struct_bytes: int = 0) -> None:
    """Merge the JSON object ``value`` into ``message``; InvalidArgument names the first bad field.

    ``max_struct_bytes`` (0: none): a ``google.protobuf.Struct`` field (a job's payload) whose JSON is
    surely longer is refused first, before the checks and the conversion that cost about 2 s and 13 s
    for 6 million numbers (:func:`json_floor`)."""
    if value is None:
        return
    if max_struct_bytes:
        _check_struct_sizes(value, message.DESCRIPTOR, "", max_struct_bytes)
    _check_message(value, message.DESCRIPTOR, "")
    try:
        json_format.ParseDict(value, message)
    except (json_format.ParseError, ValueError, TypeError, OverflowError) as exc:
        text = str(exc)
        m = re.search(r" at ([A-Za-z0-9_.\[\]]+?)\.?$", text)
        field = m.group(1).split(".", 1)[1] if m and "." in m.group(1) else ""
        raise InvalidArgument(field, text) from None
    except RecursionError:
        raise InvalidArgument("", "request is nested too deeply") from None


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _check_message(value: Any, desc: Descriptor | Any, path: str) -> None:
    if type(value) is Beyond:
        raise value.refused(path)
    full = desc.full_name
    if full in _STRUCT_JSON:
        # Keys and numbers beyond a double first: check_json_value names a value by the keys above it.
        _check_tree(value, path)
        # Their numbers become doubles: an integer beyond 2**53 would reach the API already rounded
        # (2**53 + 1 as 2**53), where nothing could tell; only here is the exact number still known.
        check_json_value(value, path)
    if full in _ANY_JSON:
        return
    if full in _OBJECT_JSON:
        if not isinstance(value, dict):
            raise InvalidArgument(path, f"must be a JSON object, got {_kind(value)}")
        return
    if full == "google.protobuf.ListValue":
        if not isinstance(value, list):
            raise InvalidArgument(path, f"must be a JSON array, got {_kind(value)}")
        return
    if full == "google.protobuf.Timestamp":
        _check_text(value, path, timestamp_pb2.Timestamp(), "an RFC 3339 timestamp (2024-01-31T12:00:00Z)")
        return
    if full == "google.protobuf.Duration":
        _check_text(value, path, duration_pb2.Duration(), "a duration in seconds with an 's' suffix (1.5s)")
        return
    if full in _WRAPPERS:
        _check_scalar(value, desc.fields_by_name["value"], path)
        return
    if not isinstance(value, dict):
        raise InvalidArgument(path, f"must be a JSON object, got {_kind(value)}")
    seen: dict[str, str] = {}
    for key, item in value.items():
        _check_key(key, path)  # before the lookup, which fails on such a key with a SystemError
        field = desc.fields_by_name.get(key) or _by_json_name(desc, key)
        if field is None:
            raise InvalidArgument(_join(path, key), f"unknown field of {desc.name}")
        if field.name in seen:
            raise InvalidArgument(_join(path, field.name), f"given twice (as {seen[field.name]!r} and {key!r})")
        seen[field.name] = key
        if item is not None:
            _check_field(item, field, _join(path, field.name))


def _check_struct_sizes(value: Any, desc: Descriptor | Any, path: str, limit: int) -> None:
    """Refuse a Struct field of ``value`` (a JSON object for ``desc``) whose :func:`json_floor` is over
    ``limit``, naming it as the API does (``jobs[2].payload``). Anything malformed is left to
    :func:`_check_message`, which runs next."""
    if not isinstance(value, dict):
        return
    for key, item in value.items():
        if item is None or not _utf8(key):  # such a key would fail the lookup (see _check_key)
            continue
        field = desc.fields_by_name.get(key) or _by_json_name(desc, key)
        if field is None or field.message_type is None or field.message_type.GetOptions().map_entry:
            continue
        name = _join(path, field.name)
        places = enumerate(item) if field.is_repeated and isinstance(item, list) else [(-1, item)]
        for i, one in places:
            where = f"{name}[{i}]" if i >= 0 else name
            if field.message_type.full_name == "google.protobuf.Struct":
                least = json_floor(one)
                if least > limit:
                    raise InvalidArgument(where, f"is at least {least} bytes as JSON; the limit is {limit} bytes")
            elif not field.message_type.full_name.startswith("google.protobuf."):
                _check_struct_sizes(one, field.message_type, where, limit)


def json_floor(value: Any) -> int:
    """The fewest bytes the compact JSON of ``value`` can take once it has been through a Struct, where a
    number may get shorter (``1.0`` is ``1``, ``1e2`` is ``100``): a number counts 1, and the rest at least
    what its quotes, brackets, colons and commas take. An array of scalars is counted without a look at each
    one (C-speed type scan only), so 6 million numbers cost about 0.1 s rather than a walk."""
    total = 0
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            n = len(item)
            total += 2 + max(n - 1, 0) + 3 * n + sum(map(len, item))  # braces, commas, quotes and colons, keys
            todo.extend(item.values())
        elif isinstance(item, list):
            n = len(item)
            total += 2 + max(n - 1, 0)
            if _SCALARS.issuperset(map(type, item)):
                total += n
            else:
                todo.extend(item)
        elif isinstance(item, str):
            total += 2 + len(item)
        else:
            total += 1
    return total


def _by_json_name(desc: Descriptor, key: str) -> FieldDescriptor | None:
    for field in desc.fields:
        if field.json_name == key:
            return field
    return None


def _check_text(value: Any, path: str, target: Any, what: str) -> None:
    if not isinstance(value, str):
        raise InvalidArgument(path, f"must be {what}, got {_kind(value)}")
    try:
        target.FromJsonString(value)
    except (ValueError, TypeError):
        raise InvalidArgument(path, f"must be {what}, got {value!r}") from None


def _check_field(value: Any, field: FieldDescriptor, path: str) -> None:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        if not isinstance(value, dict):
            raise InvalidArgument(path, f"must be a JSON object (a map), got {_kind(value)}")
        value_field = field.message_type.fields_by_name["value"]
        for key, item in value.items():
            _check_key(key, path)
            _check_single(item, value_field, f"{path}.{key}")
        return
    if field.is_repeated:
        if not isinstance(value, list):
            raise InvalidArgument(path, f"must be a JSON array, got {_kind(value)}")
        for i, item in enumerate(value):
            _check_single(item, field, f"{path}[{i}]")
        return
    _check_single(value, field, path)


def _check_single(value: Any, field: FieldDescriptor, path: str) -> None:
    if field.message_type is not None:
        if value is None and field.message_type.full_name not in _ANY_JSON:
            raise InvalidArgument(path, "must not be null")
        _check_message(value, field.message_type, path)
    else:
        _check_scalar(value, field, path)


def _check_string(value: Any, path: str) -> None:
    if not isinstance(value, str):
        raise InvalidArgument(path, f"must be a string, got {_kind(value)}")
    if not _utf8(value):
        raise InvalidArgument(path, _NOT_UTF8)


def _check_key(key: str, path: str) -> None:
    """Refuse an object key that is not valid UTF-8, naming it escaped (``labels.\\ud800``): as it is, the
    error could not carry it either."""
    if not _utf8(key):
        raise InvalidArgument(_join(path, escaped(key)), _NOT_UTF8)


def _check_tree(value: Any, path: str) -> None:
    """:func:`_check_key` for every object key in a JSON value, however deep (iterative: a value the
    decoder took may nest deeper than the recursion limit allows), and the first number beyond a double
    (:class:`Beyond`) refused, naming its path."""
    todo = deque([(value, path)])
    while todo:
        item, where = todo.popleft()
        if isinstance(item, dict):
            for key, sub in item.items():
                _check_key(key, where)
                if isinstance(sub, dict | list):
                    todo.append((sub, f"{where}.{key}"))
                elif type(sub) is Beyond:
                    raise sub.refused(f"{where}.{key}")
        elif isinstance(item, list) and not _SCALARS.issuperset(map(type, item)):  # a long array of numbers: fast
            for i, sub in enumerate(item):
                if isinstance(sub, dict | list):
                    todo.append((sub, f"{where}[{i}]"))
                elif type(sub) is Beyond:
                    raise sub.refused(f"{where}[{i}]")


def _utf8(text: str) -> bool:
    """False for text with a lone surrogate (JSON's ``"\\ud800"``), which no UTF-8 can hold."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def escaped(text: str) -> str:
    """``text`` with each lone surrogate written as its JSON escape (``\\ud800``), so that it can be shown."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _check_scalar(value: Any, field: FieldDescriptor, path: str) -> None:
    if type(value) is Beyond:
        raise value.refused(path)
    cpp = field.cpp_type
    if cpp == FieldDescriptor.CPPTYPE_STRING:
        if field.type == FieldDescriptor.TYPE_BYTES:
            if not isinstance(value, str):
                raise InvalidArgument(path, f"must be a base64 string, got {_kind(value)}")
            try:
                base64.b64decode(value.replace("-", "+").replace("_", "/") + "==")
            except (binascii.Error, ValueError):
                raise InvalidArgument(path, "must be a base64 string") from None
        else:
            _check_string(value, path)
    elif cpp == FieldDescriptor.CPPTYPE_BOOL:
        if not isinstance(value, bool):
            raise InvalidArgument(path, f"must be true or false, got {_kind(value)}")
    elif cpp in PROTO_INT_RANGES:
        low, high = PROTO_INT_RANGES[cpp]
        number = _integer(value)
        if number is None:
            raise InvalidArgument(path, f"must be an integer, got {_show(value)}")
        if not low <= number <= high:
            raise InvalidArgument(path, f"must be between {low} and {high}, got {number}")
    elif cpp in (FieldDescriptor.CPPTYPE_DOUBLE, FieldDescriptor.CPPTYPE_FLOAT):
        if isinstance(value, int) and not isinstance(value, bool) and not _fits_double(value):
            raise Beyond(str(value)).refused(path)  # float() would raise OverflowError: a 500
        real = _float(value)
        if real is None:
            raise InvalidArgument(path, f"must be a number, got {_show(value)}")
        if cpp == FieldDescriptor.CPPTYPE_FLOAT and math.isfinite(real) and abs(real) > _FLOAT32_MAX:
            raise InvalidArgument(path, f"is out of range for a float, got {real}")
    elif cpp == FieldDescriptor.CPPTYPE_ENUM:
        enum = field.enum_type
        assert enum is not None
        if isinstance(value, str):
            if value not in enum.values_by_name:
                names = ", ".join(v.name for v in enum.values)
                raise InvalidArgument(path, f"unknown value {value!r} (one of {names})")
        else:
            number = _integer(value)
            if number is None or isinstance(value, str):
                raise InvalidArgument(path, f"must be an enum name or number, got {_show(value)}")
            low, high = PROTO_INT_RANGES[FieldDescriptor.CPPTYPE_INT32]
            if not low <= number <= high:  # else protobuf's own "Value out of range", naming no field
                raise InvalidArgument(path, f"must be an enum name or a number between {low} and {high}, got {number}")


def _fits_double(value: int) -> bool:
    try:
        float(value)
    except OverflowError:
        return False
    return True


def _integer(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str) and _INTEGER.match(value):
        return int(value)
    return None


def _float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        if value in _FLOAT_WORDS:
            return float(value.replace("Infinity", "inf"))
        try:
            return _finite(value)
        except ValueError:
            return None
    return None


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str | int | float) and not isinstance(value, bool) else _kind(value)


# ---- query string -> JSON value --------------------------------------------------------------------
_TRUE = {"true", "1"}
_FALSE = {"false", "0"}


def check_query_text(raw: str) -> None:
    """Refuse a raw (still percent-encoded) query string whose names or values are not UTF-8 once
    decoded, naming the parameter. The URL parser decodes such bytes to U+FFFD, so ``?type=%ff`` listed
    the jobs of the type "\ufffd" and answered 200 (the same bytes in the path are a 400)."""
    for part in raw.split("&"):  # as the URL parser splits it: on "&" only
        name, _, value = part.partition("=")
        if not _utf8_encoded(name):
            raise InvalidArgument(name, "the name of this query parameter is not valid UTF-8 once percent-decoded")
        if not _utf8_encoded(value):
            raise InvalidArgument(urllib.parse.unquote_plus(name), "is not valid UTF-8 once percent-decoded")


def _utf8_encoded(text: str) -> bool:
    try:
        urllib.parse.unquote_to_bytes(text.replace("+", " ")).decode("utf-8")
    except UnicodeError:  # also a str that holds a surrogate-escaped byte, which cannot be encoded back
        return False
    return True


def query_to_json(pairs: Iterable[tuple[str, str]], fields: list[FieldDescriptor], message: str) -> dict[str, Any]:
    """The JSON object that query parameters stand for (``status=PENDING&status=RUNNING`` -> a list;
    ``labels[team]=edge`` -> an entry of the map ``labels``, as grpc-gateway v2 reads one).

    ``fields`` are the top-level fields the query may set; a parameter naming anything else, or a
    singular field or map key given twice, is InvalidArgument, and so is an enum number the enum does not
    list (grpc-gateway's query parser refuses one, where protojson takes it in a body), named as a body's
    would be: ``status[1]`` for the second ``status``."""
    by_name = {f.name: f for f in fields} | {f.json_name: f for f in fields}
    out: dict[str, Any] = {}
    for key, raw in pairs:
        if not key:
            raise InvalidArgument("", f"a query parameter has no name (={raw}): write name=value")
        if "[" in key:
            _map_entry(out, key, raw, by_name, message)
            continue
        head, _, rest = key.partition(".")
        field = by_name.get(head)
        if field is None:
            raise InvalidArgument(key, f"is not a query parameter of {message}")
        target, name, where = out, field.name, field.name
        while rest:  # a dotted path into a nested message: a.b.c=1
            if field.message_type is None or field.is_repeated:
                raise InvalidArgument(key, f"{field.name} has no fields")
            target = target.setdefault(name, {})
            if not isinstance(target, dict):
                raise InvalidArgument(key, "given more than once")
            head, _, rest = rest.partition(".")
            sub = field.message_type.fields_by_name.get(head) or _by_json_name(field.message_type, head)
            if sub is None:
                raise InvalidArgument(key, f"is not a query parameter of {message}")
            field, name, where = sub, sub.name, f"{where}.{sub.name}"
        if field.is_repeated:
            given = target.get(name)
            where = f"{where}[{len(given) if isinstance(given, list) else 0}]"
        value = _query_value(raw, field, key, where)
        if field.is_repeated:
            target.setdefault(name, []).append(value)
        elif name in target:
            raise InvalidArgument(key, "given more than once")
        else:
            target[name] = value
    return out


def _map_entry(out: dict[str, Any], key: str, raw: str, by_name: dict[str, FieldDescriptor], message: str) -> None:
    """``name[k]=v``: the entry ``k`` of the map field ``name`` (``k`` is all from the first ``[`` to the
    final ``]``, so a key may hold brackets too)."""
    name, _, rest = key.partition("[")
    field = by_name.get(name)
    if field is None:
        raise InvalidArgument(key, f"is not a query parameter of {message}")
    entry = field.message_type
    if entry is None or not entry.GetOptions().map_entry:
        raise InvalidArgument(key, f"{field.name} is not a map: only a map's entries are written name[key]")
    if not rest.endswith("]"):
        raise InvalidArgument(key, f"write a map's entry as {field.name}[key]=value")
    target = out.setdefault(field.name, {})
    map_key = rest[:-1]
    if map_key in target:
        raise InvalidArgument(key, "given more than once")
    target[map_key] = _query_value(raw, entry.fields_by_name["value"], key, f"{field.name}.{map_key}")


def _query_value(raw: str, field: FieldDescriptor, key: str, where: str) -> Any:
    """The JSON value of the parameter ``key`` (``raw``) for ``field``; ``where``: the value's proto path,
    which an unknown enum number is named by."""
    if field.message_type is not None and field.message_type.full_name not in _WRAPPERS | {
        "google.protobuf.Timestamp",
        "google.protobuf.Duration",
    }:
        raise InvalidArgument(key, "a message cannot be set from the query string")
    if field.cpp_type == FieldDescriptor.CPPTYPE_BOOL:
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise InvalidArgument(key, f"must be true or false, got {raw!r}")
    if field.cpp_type == FieldDescriptor.CPPTYPE_ENUM and _INTEGER.match(raw):
        number = int(raw)
        enum = field.enum_type
        assert enum is not None
        if number not in enum.values_by_number:
            names = ", ".join(f"{v.name} ({v.number})" for v in enum.values)
            raise InvalidArgument(where, f"unknown value {number} (one of {names})")
        return number
    return raw


# ---- message -> JSON -------------------------------------------------------------------------------
def to_json(message: Message) -> Any:
    """The protojson value of ``message`` (grpc-gateway v2's marshaller: unpopulated scalars included;
    unset message fields are left out), its integral numbers as ints (:func:`plain`, which keeps a
    negative zero the float ``-0.0``, which :func:`dumps` writes ``-0``)."""
    return plain(json_format.MessageToDict(message, always_print_fields_with_no_presence=True))


_NEGATIVE_ZERO_TEXT = re.compile(r"-0\.0(?![0-9])")
"""How ``json.dumps`` writes ``-0.0`` (a string or a number such as ``-0.05`` may hold it as well)."""


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON. A lone surrogate, which UTF-8 cannot hold, goes out as its JSON escape
    (``\\ud800``) rather than failing the answer: only a string can hold one, and there the escape is JSON.
    A negative zero goes out as ``-0``, as Go's protojson writes it (Python writes ``-0.0``)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    if _NEGATIVE_ZERO_TEXT.search(text):  # rare: the walk is only for an answer that may hold one
        text = _negative_zeros(value, text)
    return text.encode("utf-8", "backslashreplace")


def _negative_zeros(value: Any, text: str) -> str:
    """``text`` (the JSON of ``value``) with each ``-0.0`` number written ``-0``: encoded again with a
    marker string in its place, one that ``text`` holds nowhere, so that each marker found is one."""
    found = [0]

    def marked(item: Any) -> Any:
        if isinstance(item, float) and item == 0.0 and math.copysign(1.0, item) < 0:
            found[0] += 1
            return marker
        if isinstance(item, dict):
            return {k: marked(v) for k, v in item.items()}
        if isinstance(item, list | tuple):
            return [marked(v) for v in item]
        return item

    n = 0
    while True:  # a string value equal to the marker would be in text: take another
        marker = f"\x00-0 {n}\x00"
        quoted = json.dumps(marker, ensure_ascii=False)
        if quoted not in text:
            break
        n += 1
    again = marked(value)
    if not found[0]:
        return text
    out = json.dumps(again, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return out.replace(quoted, "-0")
