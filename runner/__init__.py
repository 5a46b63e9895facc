"""The runner: job types and how one attempt of a job is run.

Modules:
    registry   JobType, @register, get(), all_types(), JobContext: "a new job type is one registered class"
    errors     JobFailed and the exit codes of ``python -m runner``
    payload    schema validation and reading numbers that travelled as JSON
    jobs/      the built-in job types, one module each
    kernels/   numeric kernels (pure-Python references; compiled twins later)
    wire       the frame format on the pipes between a worker's pool and its runner processes
    serve      the loop a pre-started runner process runs (``python -m runner.serve``)
    __main__   ``python -m runner --job-id ID --type T --payload JSON``: one job, exit code + JSON

The public surface is :func:`execute` (run one job in this process) and :func:`load_plugins`
(import modules that register more job types).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from runner import jobs as _builtin_jobs  # noqa: F401  (registers the built-in types)
from runner.errors import JobFailed
from runner.registry import JobContext, JobType, all_types, get, register

__all__ = [  # noqa: RUF022  (grouped by concept)
    # running jobs
    "JobContext",
    "execute",
    "load_plugins",
    # defining job types
    "JobFailed",
    "JobType",
    "all_types",
    "get",
    "register",
]


def execute(job_type: str, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Run one attempt of a job of type ``job_type`` in this process and return its result.

    The payload is not validated here (the control plane did that at submit time).

    Raises:
        JobFailed: ``UNKNOWN_TYPE`` for an unregistered type; the job's own code when it raised
            JobFailed; ``ERROR`` ("ExceptionName: message") when it raised anything else or
            returned something other than a dict.
    """
    impl = get(job_type)
    try:
        result = impl.run(payload, ctx)
    except JobFailed:
        raise
    except Exception as exc:
        raise JobFailed("ERROR", f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(result, dict):
        raise JobFailed("ERROR", f"job type {job_type!r} returned {type(result).__name__}, not an object")
    return result


def load_plugins(modules: Iterable[str]) -> None:
    """Import each module by dotted name; they register their job types as they are imported.

    Raises:
        ImportError: a module cannot be imported (the error names it).
    """
    for name in modules:
        if not name:
            continue
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ImportError(f"cannot import job-type plug-in {name!r}: {exc}") from exc
