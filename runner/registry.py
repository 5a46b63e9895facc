"""The job-type registry: a new job type is one registered class.

A job type is a subclass of :class:`JobType` with three class attributes (``name``, ``schema``,
``description``) and one method, :meth:`JobType.run`. The :func:`register` class decorator
instantiates it once and files it under its name::

    @register
    class AddNumbers(JobType):
        name = "add_numbers"
        schema = {"type": "object", ...}
        description = "a + b"

        def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
            return {"sum": payload["a"] + payload["b"]}

Plug-in modules register more types the same way; a worker advertises every registered type (with
its schema) when it connects to the control plane.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, TypeVar

from corral import payload_schema
from runner.errors import JobFailed

__all__ = ["JobContext", "JobType", "all_types", "builtin_names", "get", "register"]


@dataclass(frozen=True, slots=True)
class JobContext:
    """What a job knows about the attempt it runs in."""

    job_id: str
    """The job's id."""
    attempt: int
    """The attempt number, from 1."""
    threads: int = 1
    """Threads the job may use (its thread demand)."""
    deadline: float | None = None
    """``time.time()`` after which the attempt is killed, or None for no deadline."""


class JobType:
    """Base class of every job type; subclass it and decorate the subclass with :func:`register`."""

    name: str = ""
    """The type name clients submit (``[a-z0-9_.-]``, unique in the registry)."""
    schema: dict[str, Any] = {"type": "object"}
    """JSON Schema (draft 2020-12) the payload satisfies; checked at submit time, not before run."""
    description: str = ""
    """One line for people; defaults to the first line of the class docstring."""

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Run one attempt and return its result (a JSON object).

        Raises:
            JobFailed: for a failure the job reports on purpose (a code and a message).
        """
        raise NotImplementedError


_T = TypeVar("_T", bound=type[JobType])
_REGISTRY: dict[str, JobType] = {}
_builtins_loaded = False


def _load_builtins() -> None:
    """Register the built-in types, once, before anything reads the registry or adds to it.

    Loaded on first use rather than when ``runner`` is imported: a worker imports ``runner.wire`` and
    ``runner.limits`` but runs no job itself, and the built-ins bring numpy and the compiled kernels
    (about a tenth of a second and 15 MB). Before any other registration, so that a plug-in that takes
    a built-in's name is refused, whichever is imported first."""
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True  # first: the built-ins' own @register calls come back here
        try:
            import runner.jobs  # noqa: F401
        except BaseException:
            _builtins_loaded = False  # say so again at the next use, rather than run without them
            raise


def register(cls: _T) -> _T:
    """Class decorator: instantiate ``cls`` and register it under ``cls.name``.

    Registering the same class (by module and qualified name) again replaces it, so a re-imported
    module is harmless; a different class under a taken name is an error.

    Raises:
        TypeError: ``cls`` is not a :class:`JobType` with a name, a dict schema and its own ``run``.
        ValueError: the name is taken by a different class, or its schema is one the control plane
            refuses (see :func:`_check_schema`).
    """
    if not (inspect.isclass(cls) and issubclass(cls, JobType)):
        raise TypeError(f"@register needs a JobType subclass, got {cls!r}")
    _load_builtins()
    if not isinstance(cls.name, str) or not cls.name:
        raise TypeError(f"{cls.__qualname__}.name must be a non-empty string")
    if not isinstance(cls.schema, dict):
        raise TypeError(f"{cls.__qualname__}.schema must be a dict (a JSON Schema)")
    if not cls.__module__.startswith("runner.jobs."):  # the built-ins' are checked by their tests
        _check_schema(cls)
    if cls.run is JobType.run:
        raise TypeError(f"{cls.__qualname__} must define run(payload, ctx)")
    if not cls.description:
        doc = inspect.getdoc(cls) or ""
        cls.description = doc.strip().splitlines()[0] if doc.strip() else ""
    existing = _REGISTRY.get(cls.name)
    if existing is not None and _identity(type(existing)) != _identity(cls):
        raise ValueError(f"job type {cls.name!r} is already registered by {_identity(type(existing))}")
    _REGISTRY[cls.name] = cls()
    return cls


def get(name: str) -> JobType:
    """The registered job type called ``name``.

    Raises:
        JobFailed: code ``UNKNOWN_TYPE`` when no type has that name.
    """
    _load_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise JobFailed("UNKNOWN_TYPE", f"unknown job type {name!r}") from None


def all_types() -> list[JobType]:
    """Every registered job type, sorted by name."""
    _load_builtins()
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]


def builtin_names() -> frozenset[str]:
    """The names of the built-in job types (:mod:`runner.jobs`), as against plug-ins' (user code)."""
    _load_builtins()
    return frozenset(name for name, impl in _REGISTRY.items() if type(impl).__module__.startswith("runner.jobs."))


def _check_schema(cls: type[JobType]) -> None:
    """Refuse a schema the control plane would refuse (the same check, :func:`corral.payload_schema.check`:
    a valid JSON Schema whose patterns run in linear time and whose references stay within it), as the
    plug-in is imported: a worker advertising it would be refused at every registration, for ever."""
    try:
        payload_schema.check(cls.schema)
    except payload_schema.SchemaRefused as exc:
        raise ValueError(f"{cls.__qualname__}.schema: {exc}") from None


def _identity(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
