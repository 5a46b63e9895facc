"""The runner: job types and how one attempt of a job is run.

Modules:
    registry   JobType, @register, get(), all_types(), JobContext: "a new job type is one registered class"
    plugins    load_plugins(): ``--import`` modules and the ``corral.job_types`` entry points
    errors     JobFailed and the exit codes of ``python -m runner``
    payload    schema validation and reading numbers that travelled as JSON
    arrays     numeric arrays in payloads: JSON lists and base64 ``.npy`` files
    png        PNG images in and out (Pillow)
    web        one HTTP request, streamed (network_intensive, webhook)
    limits     the per-job memory limit of a runner process (RLIMIT_AS)
    jobs/      the built-in job types, one module each
    extra/     optional job types, loaded only with ``--import`` (``command``: run a listed program)
    _lifeline  the signal that ends a runner's process group when its worker dies (compiled)
    descendants  end_descendants(): every process a runner started, found by pid, ended as it exits
    kernels/   numeric kernels: Python twins and their Cython builds (nogil, multi-threaded)
    wire       the frame format on the pipes between a worker's pool and its runner processes
    serve      the loop a pre-started runner process runs (``python -m runner.serve``)
    __main__   ``python -m runner --job-id ID --type T --payload JSON``: one job, exit code + JSON

The public surface is :func:`execute` (run one job in this process) and :func:`load_plugins`
(import modules that register more job types, and the installed ``corral.job_types`` entry points).
See ``runner/README.md`` for the job types and how to add one.
"""

from __future__ import annotations

import json
from typing import Any

from corral.jobtypes import MAX_JSON_DEPTH, too_deep
from runner.errors import JobFailed
from runner.plugins import load_plugins
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
            JobFailed; ``MEMORY_LIMIT`` when it ran out of memory (``MemoryError``); ``ERROR``
            ("ExceptionName: message") when it raised anything else, or returned something other
            than a dict or one nested deeper than ``corral.jobtypes.MAX_JSON_DEPTH``.
    """
    impl = get(job_type)
    try:
        result = impl.run(payload, ctx)
    except JobFailed:
        raise
    except MemoryError as exc:
        raise JobFailed("MEMORY_LIMIT", f"the job ran out of memory ({type(exc).__name__}: {exc})") from exc
    except Exception as exc:
        raise JobFailed("ERROR", f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(result, dict):
        raise JobFailed("ERROR", f"job type {job_type!r} returned {type(result).__name__}, not an object")
    if (where := too_deep(result)) is not None:  # it could be stored but never read back (corral.jobtypes)
        raise JobFailed("ERROR", f"job type {job_type!r} returned result{where} deeper than {MAX_JSON_DEPTH} levels")
    return result


# Bound at import: a job that replaces json.loads or json.dumps must not change this check.
_parse_as_doubles = json.JSONDecoder(parse_int=float).decode
_strict_json = json.JSONEncoder(allow_nan=False, ensure_ascii=False, check_circular=False).encode


def check_result_json(job_type: str, result_json: str) -> None:
    """Refuse a result (the JSON text of what :func:`execute` returned) that could not be carried back
    as a ``google.protobuf.Struct``: an integer beyond what a double holds (about ±1.8e308), or a
    string or key with a lone surrogate. Stored, such a result broke every read of its job.

    The control plane refuses the same (:func:`corral.job.result_fault`, which names the path); this is
    its test in C (a parse and an encode: nothing for ``{}``, microseconds for a small result), and
    that module, slow to import into every runner process, is imported only to explain a refusal.

    Raises:
        JobFailed: ``ERROR``, naming the path (``result.x[2]``) and what is wrong there.
    """
    if result_json == "{}":
        return
    try:
        # parse_int=float: an integer past a double's range becomes inf, which allow_nan=False refuses;
        # encoding to UTF-8 refuses a lone surrogate (json.dumps wrote it as an escape, "\\ud800").
        _strict_json(_parse_as_doubles(result_json)).encode()
        return
    except (ValueError, RecursionError):
        pass
    from corral.job import result_fault

    fault = result_fault(result_json) or "result: cannot be carried back as a google.protobuf.Struct"
    raise JobFailed("ERROR", f"job type {job_type!r} returned {fault}")
