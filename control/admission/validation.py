"""Submission rules: field ranges, sizes, and each job type's payload schema.

Every rule names the field it checks, so a client learns exactly what to fix:
``payload.a: 'x' is not of type 'integer'``. Nothing is stored for a request that breaks a rule.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import referencing
from jsonschema.exceptions import ValidationError

from control import notify
from control.jobs import StartWhen
from control.notify import NotifyTarget
from control.store.base import JobTypeEntry
from corral import payload_schema
from corral.errors import InvalidArgument
from corral.jobtypes import BUILTIN_SCHEMAS, MAX_EXACT_INTEGER, MAX_JSON_DEPTH, too_deep
from corral.limits import MAX_GPUS, MAX_LABEL_KEY, MAX_LABEL_VALUE, MAX_LABELS, MAX_MEMORY_MB, MAX_THREADS

MAX_PRIORITY = 100
MAX_ATTEMPTS = 100
MAX_TIMEOUT_SEC = 7 * 24 * 3600.0
MAX_NAME = 256
MAX_TYPE = 128
MAX_KEY = 256
MAX_RULE_TEXT = 400
"""Longest rule text in an error: a schema message quoting a huge value is shortened in the middle."""


@dataclass(slots=True)
class Submission:
    """A job as a client asked for it, before defaults are applied (None = not given)."""

    type: str
    payload: dict[str, Any]
    name: str = ""
    priority: int = 0
    thread_demand: int | None = None
    timeout_sec: float | None = None
    max_attempts: int | None = None
    scheduled_at: float | None = None
    idempotency_key: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    payload_json: str = ""
    worker_selector: dict[str, str] = field(default_factory=dict)
    depends_on: tuple[str, ...] = ()
    gpu_count: int = 0
    memory_mb: int = 0
    depends_on_index: tuple[int, ...] = ()
    """Earlier jobs of the same batch this one depends on, by their place in it."""
    notify: tuple[NotifyTarget, ...] = ()
    """Where its ends are announced."""
    start_when: int = 0
    """What its dependencies must do first (a ``StartWhen`` value, checked by :func:`validate`)."""
    payload_checked: object | None = field(default=None, compare=False, repr=False)
    """The type's payload validator that :func:`validate` last passed ``payload`` with (``payload_json``
    made and within the size limit): a later :func:`validate` under the same validator checks the other
    fields only. A large payload is checked on a worker thread before intake (control.api.jobs), and
    intake, on the event loop, does not check it again unless the type's schema changed meanwhile."""

    def request_hash(self) -> str:
        """A digest of everything that defines the job: equal requests have equal hashes."""
        canon = json.dumps(
            [
                self.type,
                self.payload,
                self.name,
                self.priority,
                self.thread_demand,
                self.timeout_sec,
                self.max_attempts,
                self.scheduled_at,
                sorted(self.labels.items()),
                # Only when given: a request without a selector hashes as it did before there were
                # any, so keys stored then still match their replays.
                *([sorted(self.worker_selector.items())] if self.worker_selector else []),
                *([sorted(self.depends_on)] if self.depends_on else []),
                *([["gpu_count", self.gpu_count]] if self.gpu_count else []),
                *([["memory_mb", self.memory_mb]] if self.memory_mb else []),
                *([["depends_on_index", list(self.depends_on_index)]] if self.depends_on_index else []),
                *([["notify", notify.dumps(self.notify)]] if self.notify else []),
                *([["start_when", self.start_when]] if self.start_when else []),
            ],
            sort_keys=True,
            separators=(",", ":"),
            default=str,
        )
        return hashlib.sha256(canon.encode()).hexdigest()


class JobTypeCatalog:
    """Known job types and their compiled payload validators: the built-ins plus what workers advertise."""

    def __init__(self, extra: Iterable[JobTypeEntry] = ()) -> None:
        self._schemas: dict[str, str] = {}
        self._validators: dict[str, jsonschema.protocols.Validator] = {}
        for name, schema in BUILTIN_SCHEMAS.items():
            self._install(name, schema)
        for entry in extra:
            self.add(entry)

    def _install(self, name: str, schema: dict[str, Any]) -> None:
        payload_schema.check(schema)
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        # An empty registry retrieves nothing: check() lets only references within the schema through.
        self._validators[name] = _linear_patterns(_exact_integers(cls))(schema, registry=referencing.Registry())
        self._schemas[name] = json.dumps(schema, sort_keys=True)

    def add(self, entry: JobTypeEntry) -> bool:
        """Learn or update a type; True when something changed. A bad schema raises InvalidArgument."""
        if entry.name in BUILTIN_SCHEMAS:
            return False
        try:
            schema = json.loads(entry.schema_json) if entry.schema_json else {"type": "object"}
            canon = json.dumps(schema, sort_keys=True)
            if self._schemas.get(entry.name) == canon:
                return False
            self._install(entry.name, schema)
        except payload_schema.SchemaRefused as exc:
            raise InvalidArgument(f"job_types[{entry.name}].payload_schema_json", str(exc)) from None
        except ValueError as exc:
            raise InvalidArgument(
                f"job_types[{entry.name}].payload_schema_json", f"not a valid JSON Schema: {exc}"
            ) from exc
        return True

    def __contains__(self, name: str) -> bool:
        return name in self._validators

    def names(self) -> list[str]:
        """Every known type's name, sorted: the built-ins and those workers advertised."""
        return sorted(self._validators)

    def validator(self, name: str) -> jsonschema.protocols.Validator | None:
        """The type's payload validator (None for an unknown type); a changed schema gets a new one."""
        return self._validators.get(name)

    def validate(
        self,
        name: str,
        payload: dict[str, Any],
        field_prefix: str,
        validator: jsonschema.protocols.Validator | None = None,
    ) -> None:
        """Raise InvalidArgument naming the first payload field that breaks the type's schema (``validator``:
        the one :meth:`validator` gave, when read already)."""
        if validator is None:
            validator = self._validators[name]
        error = jsonschema.exceptions.best_match(validator.iter_errors(payload))
        if error is not None:
            path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
            message = error.message
            if error.validator == "type" and isinstance(error.instance, float) and error.instance.is_integer():
                message = (
                    f"{error.instance:g} is beyond ±2**53 ({MAX_EXACT_INTEGER}): payload numbers travel as doubles "
                    "and an integer this large may have been rounded"
                )
            if len(message) > MAX_RULE_TEXT:  # the message quotes the bad value, which may be megabytes
                message = message[: MAX_RULE_TEXT // 2] + " ... " + message[-MAX_RULE_TEXT // 2 :]
            raise InvalidArgument(f"{field_prefix}payload{path}", message)


def _is_exact_integer(checker: Any, instance: Any) -> bool:
    # Struct numbers are doubles: the integral ones within 2**53 were turned back into ints on the way in
    # (control.api.convert.plain), so an integral float left here is one that may have been rounded.
    return isinstance(instance, int) and not isinstance(instance, bool)


@functools.cache
def _exact_integers(cls: Any) -> Any:
    """``cls`` with JSON Schema's ``integer`` meaning an integer carried exactly (see _is_exact_integer)."""
    extend: Callable[..., Any] = jsonschema.validators.extend
    return extend(cls, type_checker=cls.TYPE_CHECKER.redefine("integer", _is_exact_integer))


def _linear_patterns(cls: Any) -> Any:
    """``cls`` matching payloads against its patterns with RE2, in linear time (corral.payload_schema):
    ``pattern``, ``patternProperties`` and the properties ``additionalProperties`` leaves to them."""
    extend: Callable[..., Any] = jsonschema.validators.extend
    return extend(
        cls,
        validators={
            "pattern": _pattern,
            "patternProperties": _pattern_properties,
            "additionalProperties": _additional_properties,
        },
    )


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not payload_schema.search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: dict[str, Any], instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if payload_schema.search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, allowed: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    named = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [
        key
        for key in instance
        if key not in named and not any(payload_schema.search(pattern, key) for pattern in patterns)
    ]
    if validator.is_type(allowed, "object"):
        for key in extras:
            yield from validator.descend(instance[key], allowed, path=key)
    elif not allowed and extras:
        listed = ", ".join(repr(key) for key in sorted(extras))
        if patterns:
            yield ValidationError(f"{listed} do not match any of the regexes: {', '.join(map(repr, sorted(patterns)))}")
        else:
            yield ValidationError(f"Additional properties are not allowed ({listed} unexpected)")


@dataclass(frozen=True, slots=True)
class Limits:
    """The configured bounds a submission is checked against."""

    max_payload_bytes: int
    max_batch: int


def _check_range(name: str, value: float, low: float, high: float) -> None:
    if not (low <= value <= high):
        raise InvalidArgument(name, f"must be between {_number(low)} and {_number(high)}, got {_number(value)}")


def _number(value: float) -> str:
    """An integer in full (a limit such as 1073741824 MiB, not 1.07374e+09); other numbers short."""
    return str(value) if isinstance(value, int) else f"{value:g}"


def check_text(name: str, value: str, limit: int) -> None:
    """At most ``limit`` characters and no NUL; raises InvalidArgument naming ``name``."""
    if len(value) > limit:
        raise InvalidArgument(name, f"must be at most {limit} characters, got {len(value)}")
    if "\x00" in value:
        raise InvalidArgument(name, "must not contain NUL characters")


def check_labels(labels: Mapping[str, str], field: str) -> None:
    """A job's or a worker's labels: how many, key and value lengths, no NUL. Raises InvalidArgument."""
    if len(labels) > MAX_LABELS:
        raise InvalidArgument(field, f"at most {MAX_LABELS} labels, got {len(labels)}")
    for key, value in labels.items():
        if not key:
            raise InvalidArgument(field, "label keys must not be empty")
        check_text(f"{field}[{key}]", key, MAX_LABEL_KEY)
        check_text(f"{field}[{key}]", value, MAX_LABEL_VALUE)


MAX_DEPENDENCIES = 64
"""Jobs one job may wait for."""
MAX_JOB_ID = 64
"""No job id is longer (they are 32 hex digits)."""


def check_dependencies(ids: Sequence[str], field: str) -> None:
    """How many, and each a plausible id, not repeated. Raises InvalidArgument naming the entry."""
    if len(ids) > MAX_DEPENDENCIES:
        raise InvalidArgument(field, f"at most {MAX_DEPENDENCIES} jobs, got {len(ids)}")
    seen: set[str] = set()
    for i, job_id in enumerate(ids):
        if not job_id:
            raise InvalidArgument(f"{field}[{i}]", "must be a job id, got an empty string")
        check_text(f"{field}[{i}]", job_id, MAX_JOB_ID)
        if job_id in seen:
            raise InvalidArgument(f"{field}[{i}]", f"repeats {job_id!r}")
        seen.add(job_id)


def check_start_when(sub: Submission, prefix: str) -> None:
    """A known value, and only for a job with dependencies (it would change nothing). Raises
    InvalidArgument."""
    field = f"{prefix}start_when"
    if sub.start_when not in StartWhen._value2member_map_:
        names = " or ".join(s.name for s in StartWhen)
        raise InvalidArgument(field, f"must be {names}, got {sub.start_when}")
    if not (sub.depends_on or sub.depends_on_index):
        raise InvalidArgument(field, "applies only to a job with depends_on or depends_on_index")


def check_batch_dependencies(sub: Submission, place: int | None, prefix: str) -> None:
    """``sub.depends_on_index``: only in a batch, each an earlier job of it, none twice, and with
    ``depends_on`` at most :data:`MAX_DEPENDENCIES`. Earlier only, so a batch's links can form no
    cycle. Raises InvalidArgument naming the entry."""
    field = f"{prefix}depends_on_index"
    if place is None:
        raise InvalidArgument(
            field, "only in a SubmitJobs batch; name a job that already exists by its id in depends_on"
        )
    total = len(sub.depends_on) + len(sub.depends_on_index)
    if total > MAX_DEPENDENCIES:
        raise InvalidArgument(field, f"at most {MAX_DEPENDENCIES} jobs with depends_on, got {total}")
    seen: set[int] = set()
    for i, index in enumerate(sub.depends_on_index):
        if not 0 <= index < place:
            earlier = f"0..{place - 1}" if place else "none: this is the batch's first job"
            raise InvalidArgument(
                f"{field}[{i}]", f"must be the index of an earlier job of this batch ({earlier}), got {index}"
            )
        if index in seen:
            raise InvalidArgument(f"{field}[{i}]", f"repeats {index}")
        seen.add(index)


def validate(
    sub: Submission, catalog: JobTypeCatalog, limits: Limits, prefix: str = "", place: int | None = None
) -> None:
    """Check one submission; fills ``sub.payload_json``. ``place``: its index in a batch (None: not in
    one). Raises InvalidArgument naming the field."""
    if not sub.type:
        raise InvalidArgument(f"{prefix}type", "is required")
    check_text(f"{prefix}type", sub.type, MAX_TYPE)
    if sub.type not in catalog:
        known = ", ".join(catalog.names())
        raise InvalidArgument(f"{prefix}type", f"unknown job type {sub.type!r}; known types: {known}")
    check_text(f"{prefix}name", sub.name, MAX_NAME)
    check_text(f"{prefix}idempotency_key", sub.idempotency_key, MAX_KEY)
    _check_range(f"{prefix}priority", sub.priority, 0, MAX_PRIORITY)
    if sub.thread_demand is not None:
        _check_range(f"{prefix}thread_demand", sub.thread_demand, 1, MAX_THREADS)
    _check_range(f"{prefix}gpu_count", sub.gpu_count, 0, MAX_GPUS)
    _check_range(f"{prefix}memory_mb", sub.memory_mb, 0, MAX_MEMORY_MB)
    if sub.max_attempts is not None:
        _check_range(f"{prefix}max_attempts", sub.max_attempts, 1, MAX_ATTEMPTS)
    if sub.timeout_sec is not None:
        if not math.isfinite(sub.timeout_sec):
            raise InvalidArgument(
                f"{prefix}timeout_sec", f"must be a finite number of seconds, got {sub.timeout_sec:g}"
            )
        if sub.timeout_sec <= 0:
            raise InvalidArgument(f"{prefix}timeout_sec", f"must be > 0 seconds, got {sub.timeout_sec:g}")
        _check_range(f"{prefix}timeout_sec", sub.timeout_sec, 0, MAX_TIMEOUT_SEC)
    check_labels(sub.labels, f"{prefix}labels")
    if sub.worker_selector:
        check_labels(sub.worker_selector, f"{prefix}worker_selector")
    if sub.depends_on:
        check_dependencies(sub.depends_on, f"{prefix}depends_on")
    if sub.depends_on_index:
        check_batch_dependencies(sub, place, prefix)
    if sub.notify:
        notify.check_targets(sub.notify, f"{prefix}notify")
    if sub.start_when:
        check_start_when(sub, prefix)
    validator = catalog.validator(sub.type)  # read once: a worker thread may run this while a type changes
    if sub.payload_checked is not None and sub.payload_checked is validator:
        return  # passed already under the same schema (see Submission.payload_checked)
    if (where := too_deep(sub.payload)) is not None:
        # deeper would be stored, but GetJob, WatchJob and ListJobs could not carry it back
        raise InvalidArgument(
            f"{prefix}payload{where}", f"nests deeper than {MAX_JSON_DEPTH} levels of objects and arrays"
        )
    payload_json = json.dumps(sub.payload, separators=(",", ":"), ensure_ascii=False)
    size = len(payload_json.encode())
    if size > limits.max_payload_bytes:
        raise InvalidArgument(f"{prefix}payload", f"is {size} bytes; the limit is {limits.max_payload_bytes} bytes")
    catalog.validate(sub.type, sub.payload, prefix, validator)
    sub.payload_json = payload_json
    sub.payload_checked = validator


def validate_batch(subs: list[Submission], catalog: JobTypeCatalog, limits: Limits) -> None:
    """Check a batch: its size, then every job (fields named ``jobs[i].…``)."""
    check_batch_size(subs, limits)
    validate_part(subs, 0, catalog, limits)


def check_batch_size(subs: Sequence[Submission], limits: Limits) -> None:
    """A batch holds 1 to ``limits.max_batch`` jobs. Raises InvalidArgument."""
    if not subs:
        raise InvalidArgument("jobs", "must hold at least one job")
    if len(subs) > limits.max_batch:
        raise InvalidArgument("jobs", f"at most {limits.max_batch} jobs per batch, got {len(subs)}")


def validate_part(part: Sequence[Submission], start: int, catalog: JobTypeCatalog, limits: Limits) -> None:
    """Check the jobs of a batch from index ``start`` on (fields named ``jobs[i].…``)."""
    for i, sub in enumerate(part, start):
        validate(sub, catalog, limits, prefix=f"jobs[{i}].", place=i)
