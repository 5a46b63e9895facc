"""The REST routes, read from the ``google.api.http`` annotations of the service descriptors.

Nothing here is written by hand per route: :func:`http_routes` walks every method of the given
services, reads its ``HttpRule`` (and ``additional_bindings``) and parses the path template with
grpc-gateway's grammar, restricted to what a flat REST API needs::

    Template = "/" Segment { "/" Segment } [ ":" Verb ]
    Segment  = LITERAL | "{" FieldPath [ "=*" ] "}"

The same routes feed the gateway's :class:`Router` and the OpenAPI generator (``protos/openapi.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

from google.api import annotations_pb2, http_pb2
from google.protobuf.descriptor import FieldDescriptor, MethodDescriptor, ServiceDescriptor

_VARIABLE = re.compile(r"^\{([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*)(=\*)?\}$")
_LITERAL = re.compile(r"^[A-Za-z0-9._~-]+$")


class TemplateError(ValueError):
    """Raised when an http rule's path template is outside the supported grammar."""


@dataclass(frozen=True, slots=True)
class PathTemplate:
    """A parsed template: literal segments or ``None`` for a variable, the variables' field paths, the verb."""

    text: str
    segments: tuple[str | None, ...]
    variables: tuple[str, ...]
    verb: str

    @classmethod
    def parse(cls, text: str) -> PathTemplate:
        """The template ``text`` (``/v1/workers/{id}:drain``) parsed.

        Raises:
            TemplateError: ``text`` is outside the grammar of the module docstring.
        """
        if not text.startswith("/"):
            raise TemplateError(f"{text!r}: a path template starts with '/'")
        body, verb = text, ""
        last = text.rsplit("/", 1)[-1]
        if ":" in last and not last.endswith("}"):
            body, verb = text.rsplit(":", 1)
            if not _LITERAL.match(verb):
                raise TemplateError(f"{text!r}: bad verb {verb!r}")
        segments: list[str | None] = []
        variables: list[str] = []
        for part in body[1:].split("/"):
            m = _VARIABLE.match(part)
            if m:
                segments.append(None)
                variables.append(m.group(1))
            elif _LITERAL.match(part):
                segments.append(part)
            else:
                raise TemplateError(f"{text!r}: unsupported segment {part!r}")
        return cls(text, tuple(segments), tuple(variables), verb)

    def match(self, parts: list[str], verb: str) -> dict[str, str] | None:
        """The variables' values when ``parts`` (percent-encoded path segments) and ``verb`` match."""
        if verb != self.verb or len(parts) != len(self.segments):
            return None
        values: list[str] = []
        for want, got in zip(self.segments, parts, strict=True):
            if want is None:
                if not got:
                    return None
                values.append(unquote(got, errors="strict"))
            elif want != got:
                return None
        return dict(zip(self.variables, values, strict=True))


@dataclass(frozen=True, slots=True)
class Route:
    """One HTTP binding of one RPC."""

    http_method: str
    template: PathTemplate
    service: ServiceDescriptor
    method: MethodDescriptor
    body: str
    """"*" (the whole request), a top-level field name, or "" (no body: the rest comes from the query)."""
    response_body: str

    @property
    def name(self) -> str:
        """``JobService.SubmitJob``: the route's label in metrics and logs."""
        return f"{self.service.name}.{self.method.name}"

    @property
    def streaming(self) -> bool:
        """Whether the answer is a stream of messages (sent as newline-delimited JSON)."""
        return bool(self.method.server_streaming)

    @property
    def client_streaming(self) -> bool:
        """Whether the request is a stream of messages (its body: JSON values one after another)."""
        return bool(self.method.client_streaming)

    def query_fields(self) -> list[FieldDescriptor]:
        """Top-level request fields that the query string may set (not bound by the path or the body)."""
        if self.body == "*":
            return []
        bound = {v.split(".")[0] for v in self.template.variables} | {self.body}
        return [f for f in self.method.input_type.fields if f.name not in bound]


_PATTERNS = ("get", "put", "post", "delete", "patch")


def _bindings(rule: http_pb2.HttpRule) -> list[http_pb2.HttpRule]:
    return [rule, *rule.additional_bindings]


def http_routes(services: tuple[ServiceDescriptor, ...] | list[ServiceDescriptor]) -> list[Route]:
    """Every HTTP binding of every annotated method of ``services``, in declaration order."""
    routes: list[Route] = []
    for service in services:
        for method in service.methods:
            rule = method.GetOptions().Extensions[annotations_pb2.http]
            if not rule.WhichOneof("pattern"):
                continue
            for binding in _bindings(rule):
                kind = binding.WhichOneof("pattern")
                if kind == "custom":
                    verb, path = binding.custom.kind.upper(), binding.custom.path
                elif kind in _PATTERNS:
                    verb, path = kind.upper(), getattr(binding, kind)
                else:
                    raise TemplateError(f"{method.full_name}: http rule without a pattern")
                template = PathTemplate.parse(path)
                _check_fields(method, template, binding.body)
                routes.append(Route(verb, template, service, method, binding.body, binding.response_body))
    return routes


def _check_fields(method: MethodDescriptor, template: PathTemplate, body: str) -> None:
    fields = method.input_type.fields_by_name
    for variable in template.variables:
        top = variable.split(".")[0]
        if top not in fields:
            raise TemplateError(f"{method.full_name}: path variable {variable!r} is not a request field")
    if body not in ("", "*") and body not in fields:
        raise TemplateError(f"{method.full_name}: body {body!r} is not a request field")


@dataclass(frozen=True, slots=True)
class Match:
    """A request's route and its path variables; ``allowed`` lists methods when only the method was wrong."""

    route: Route | None
    params: dict[str, str]
    allowed: tuple[str, ...] = ()


class Router:
    """Finds the route of a request: routes with a verb (``:cancel``) are tried before those without."""

    def __init__(self, routes: list[Route]) -> None:
        self.routes = sorted(routes, key=lambda r: r.template.verb == "")

    def match(self, http_method: str, raw_path: str) -> Match:
        """The route for ``http_method`` and the percent-encoded ``raw_path``.

        Raises UnicodeDecodeError when a path variable is not UTF-8 once decoded."""
        parts = raw_path[1:].split("/") if raw_path.startswith("/") else []
        last = parts[-1] if parts else ""
        verb, verb_parts = "", parts
        if ":" in last:
            head, verb = last.rsplit(":", 1)
            verb_parts = [*parts[:-1], head]
        allowed: list[str] = []
        for route in self.routes:
            t = route.template
            params = t.match(verb_parts, verb) if t.verb and verb else t.match(parts, "")
            if params is None:
                continue
            if route.http_method == http_method:
                return Match(route, params)
            allowed.append(route.http_method)
        return Match(None, {}, tuple(dict.fromkeys(allowed)))
