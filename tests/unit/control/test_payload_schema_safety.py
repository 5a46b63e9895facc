"""Plug-in payload schemas the control plane runs on its event loop (corral.payload_schema): patterns are
matched in linear time, patterns that cannot be are refused as the type registers, and no reference
leads outside the schema (nothing is ever fetched)."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from control.admission.validation import JobTypeCatalog
from control.store.base import JobTypeEntry
from corral.errors import InvalidArgument


def _catalog(schema: dict[str, Any]) -> JobTypeCatalog:
    return JobTypeCatalog([JobTypeEntry("plug", json.dumps(schema), "")])


@pytest.mark.timeout(20)
def test_a_pattern_that_backtracks_is_matched_in_linear_time() -> None:
    # Given a plug-in schema with a pattern a backtracking engine takes exponential time on
    catalog = _catalog({"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}})
    # When payloads that make it backtrack are checked (with Python's engine, 36 characters held the
    # control plane's event loop at full CPU for good; 10,000 are nothing for a linear one)
    t0 = time.monotonic()
    for n in (36, 10_000):
        with pytest.raises(InvalidArgument, match=r"payload\.s: .* does not match '\^\(a\+\)\+\$'"):
            catalog.validate("plug", {"s": "a" * n + "!"}, "")
    # Then they are refused at once, and a matching one passes
    assert time.monotonic() - t0 < 5
    catalog.validate("plug", {"s": "a" * 10_000}, "")


@pytest.mark.timeout(20)
def test_pattern_properties_and_the_properties_they_leave_are_matched_in_linear_time() -> None:
    catalog = _catalog(
        {"type": "object", "patternProperties": {"^(x+)+$": {"type": "integer"}}, "additionalProperties": False}
    )
    catalog.validate("plug", {"xxx": 1}, "")
    with pytest.raises(InvalidArgument, match=r"payload\.xx: 'no' is not of type 'integer'"):
        catalog.validate("plug", {"xx": "no"}, "")
    with pytest.raises(InvalidArgument, match="do not match any of the regexes"):
        catalog.validate("plug", {"x" * 40 + "!": 1}, "")


@pytest.mark.parametrize(
    ("schema", "rule"),
    [
        (
            {"properties": {"s": {"pattern": r"(a)\1"}}},
            r"pattern '\(a\)\\\\1' at /properties/s/pattern cannot be matched in linear time",
        ),
        ({"patternProperties": {"(?=a)b": {}}}, r"pattern '\(\?=a\)b' at /patternProperties/\(\?=a\)b cannot be"),
        (
            {"patternProperties": {"^a": {}}, "unevaluatedProperties": False},
            "unevaluatedProperties at /unevaluatedProperties in a schema with patternProperties: not supported",
        ),
        ({"properties": {"n": {"minimum": "x"}}}, "not a valid JSON Schema: 'x' is not of type 'number'"),
    ],
)
def test_a_schema_the_control_plane_would_not_run_safely_is_refused_naming_the_place(
    schema: dict[str, Any], rule: str
) -> None:
    with pytest.raises(InvalidArgument, match=r"job_types\[plug\]\.payload_schema_json: " + rule):
        _catalog({"type": "object", **schema})


@pytest.fixture
def schema_server() -> Iterator[tuple[str, list[str]]]:
    """A server on 127.0.0.1 that serves a schema and records every request."""
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            body = b'{"type": "object"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/schema.json", asked
    server.shutdown()
    server.server_close()


def test_a_reference_outside_the_schema_is_refused_and_nothing_is_fetched(
    schema_server: tuple[str, list[str]],
) -> None:
    url, asked = schema_server
    # Given a plug-in schema whose $ref names another document
    with pytest.raises(InvalidArgument, match=r"\$ref '.*/schema.json' at /properties/x/\$ref points outside the"):
        _catalog({"type": "object", "properties": {"x": {"$ref": url}}})
    # Then it was never fetched, and a reference within the schema still works
    catalog = _catalog(
        {"type": "object", "$defs": {"n": {"type": "integer"}}, "properties": {"x": {"$ref": "#/$defs/n"}}}
    )
    catalog.validate("plug", {"x": 1}, "")
    with pytest.raises(InvalidArgument, match=r"payload\.x: 'a' is not of type 'integer'"):
        catalog.validate("plug", {"x": "a"}, "")
    assert asked == []
