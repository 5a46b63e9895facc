"""What a job type's payload schema may be, checked the same way where a plug-in declares it (the
runner, as the plug-in is imported) and where the control plane learns it (a worker registering).

A payload schema is run by the control plane on every submission of its type, on the event loop that
every call and every worker's heartbeats share. So, beyond being a valid JSON Schema:

* Its regular expressions (``pattern``, the keys of ``patternProperties``) must have a linear-time
  match, and are matched with RE2 (:func:`search`): with a backtracking engine, a pattern such as
  ``^(a+)+$`` and a payload of 36 characters held the control plane at full CPU for good, every call
  timing out. RE2 has no backreferences and no lookaround; a pattern that uses them is refused, naming it.
  RE2 also reads ``\\d`` and ``\\w`` as ASCII, as JSON Schema's ECMA-262 regular expressions do.
* Its references (``$ref``, ``$dynamicRef``) must point within the schema (``#...``): a reference to
  another document would have the control plane fetch it, from an address a plug-in chose, on a
  submission's way through.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

__all__ = ["SchemaRefused", "check", "search"]

_REF_KEYS = ("$ref", "$dynamicRef")


class SchemaRefused(ValueError):
    """A payload schema Corral does not run; the message names the place and the rule."""


def check(schema: Any) -> None:
    """Raise :class:`SchemaRefused` unless ``schema`` is a JSON Schema (by the draft it names, 2020-12 if
    none) whose regular expressions RE2 runs and whose references stay within it."""
    import jsonschema  # imported here: a runner of built-in types never needs it (it is slow to import)

    if not isinstance(schema, dict):
        raise SchemaRefused(f"a payload schema must be a JSON object, got {type(schema).__name__}")
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise SchemaRefused(f"not a valid JSON Schema: {exc.message} (at {_where(exc.absolute_path)})") from None
    for path, key, value in _walk(schema, ()):
        if key == "pattern" and isinstance(value, str):
            _linear(value, (*path, key))
        elif key == "patternProperties" and isinstance(value, dict):
            for pattern in value:
                _linear(pattern, (*path, key, pattern))
        elif key == "unevaluatedProperties" and _has_pattern_properties(schema):
            # jsonschema works out which properties were evaluated with Python's own engine, not RE2
            raise SchemaRefused(
                f"unevaluatedProperties at {_where((*path, key))} in a schema with patternProperties: not "
                "supported (the patterns would be matched by a backtracking engine); use additionalProperties"
            )
        elif key in _REF_KEYS and isinstance(value, str) and not value.startswith("#"):
            raise SchemaRefused(
                f"{key} {value!r} at {_where((*path, key))} points outside the schema: only references within it "
                "('#...') are followed, so that nothing is fetched"
            )


def search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` (one :func:`check` let through) matches somewhere in ``text``, in linear time."""
    return _compiled(pattern).search(text) is not None


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> Any:
    import re2  # google-re2

    options = re2.Options()
    options.log_errors = False  # a refused pattern is said once, in the refusal, not on stderr
    return re2.compile(pattern, options=options)


def _linear(pattern: str, path: tuple[str | int, ...]) -> None:
    try:
        _compiled(pattern)
    except Exception as exc:  # re2's own error type (re2.error), whose message is bytes
        why = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise SchemaRefused(
            f"pattern {pattern!r} at {_where(path)} cannot be matched in linear time ({why}): payload patterns are "
            "matched with RE2, which has no backreferences and no lookaround"
        ) from None


def _walk(node: Any, path: tuple[str | int, ...]) -> Iterator[tuple[tuple[str | int, ...], str, Any]]:
    """Every (path, key, value) of the objects in ``node``, depth first."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield path, key, value
            yield from _walk(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, (*path, i))


def _has_pattern_properties(schema: Any) -> bool:
    return any(key == "patternProperties" for _, key, _ in _walk(schema, ()))


def _where(path: Any) -> str:
    parts = list(path)
    return "/" + "/".join(str(p) for p in parts) if parts else "the top"
