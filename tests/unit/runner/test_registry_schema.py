"""@register refuses a job type whose schema the control plane would refuse (corral.payload_schema): not
a valid JSON Schema, a pattern with no linear-time match, a reference outside the schema."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import runner.registry
from runner.registry import JobContext, JobType, all_types, get, register


@pytest.fixture(autouse=True)
def _own_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    all_types()  # the built-ins first, as in a runner
    monkeypatch.setattr(runner.registry, "_REGISTRY", dict(runner.registry._REGISTRY))


def _type(schema: dict[str, Any]) -> type[JobType]:
    class Plugin(JobType):
        name = f"schema-{uuid.uuid4().hex[:8]}"

        def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
            return {}

    Plugin.schema = schema
    return Plugin


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"type": "object", "properties": {"a": {"pattern": "(unclosed"}}}, "regex"),
        ({"properties": {"a": {"minimum": "x"}}}, "'x' is not of type 'number' (at /properties/a/minimum)"),
        ({"type": "bogus_type"}, "bogus_type"),
        ({"required": "a"}, "'a' is not of type 'array' (at /required)"),
        ({"properties": {"a": {"pattern": "(a)\\1"}}}, "at /properties/a/pattern cannot be matched in linear time"),
        ({"properties": {"a": {"$ref": "https://example.invalid/a.json"}}}, "points outside the schema"),
    ],
)
def test_a_schema_the_control_plane_refuses_is_refused_as_the_type_registers(schema: dict[str, Any], says: str) -> None:
    cls = _type(schema)
    with pytest.raises(ValueError, match=r"Plugin\.schema: ") as refused:
        register(cls)
    assert says in str(refused.value)


def test_a_valid_schema_registers() -> None:
    cls = register(_type({"type": "object", "properties": {"a": {"type": "string", "pattern": "^[a-z]+$"}}}))
    assert type(get(cls.name)) is cls
