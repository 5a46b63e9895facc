"""The job file of ``corral submit-many``: a JSON batch of jobs, read into :class:`~corral.spec.JobSpec`\\ s.

The file is what REST's ``POST /v1/jobs:batchSubmit`` takes as its body, so one file serves ``curl`` and
the CLI: an object ``{"jobs": [...]}``, or just the array. Each job is an object whose keys are
:class:`~corral.spec.JobSpec`'s fields, in snake_case or in the lowerCamelCase protojson gives them
(``depends_on_index`` or ``dependsOnIndex``); ``null`` leaves a field at its default, as protojson does.
``scheduled_at`` is a string, read as ``corral submit --at`` reads it (ISO 8601 or ``+30s``), or Unix
seconds as a number.

Every problem is a :class:`BadJobFile` (an :class:`~corral.errors.InvalidArgument`) naming where it is
(``jobs[1].colour``), raised before anything is sent. This module checks what only a file can get wrong
(its JSON, its shape, its keys, a list where an object belongs); the values themselves are checked by
:meth:`JobSpec.to_proto <corral.spec.JobSpec.to_proto>` as the batch is built, and by the control plane.
``corral`` exits 2 (bad input) for all of them alike, as for a ``--payload`` that is not a JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from corral.cli import values
from corral.errors import InvalidArgument
from corral.job import Notify
from corral.spec import JobSpec

__all__ = ["FIELDS", "STDIN", "BadJobFile", "load", "parse"]


class BadJobFile(InvalidArgument):
    """The job file cannot be read, is not JSON, or is not a batch of job objects with JobSpec's keys."""


STDIN = "-"
"""The path that means standard input."""

FIELDS = tuple(f.name for f in dataclasses.fields(JobSpec))
"""A job object's keys in snake_case, in JobSpec's order."""


def _camel(name: str) -> str:
    """``depends_on_index`` -> ``dependsOnIndex``: the JSON name protojson gives a proto field."""
    first, *rest = name.split("_")
    return first + "".join(part.capitalize() for part in rest)


_NAMES = {**{_camel(name): name for name in FIELDS}, **{name: name for name in FIELDS}}
"""Each accepted key -> the JobSpec field it sets."""
_KNOWN = f"known fields: {', '.join(FIELDS)} (or in lowerCamelCase: {_camel('thread_demand')} ...)"
_OBJECTS = ("payload", "labels", "worker_selector")
_ARRAYS = ("depends_on", "depends_on_index")


def load(path: str) -> list[JobSpec]:
    """Read the job file at ``path`` (``-``: standard input) into one spec per job, in the file's order.

    Raises:
        InvalidArgument: when the file cannot be read or is not a batch of jobs (see the module docstring).
    """
    source = "stdin" if path == STDIN else path
    try:
        data = sys.stdin.buffer.read() if path == STDIN else Path(path).read_bytes()
        text = data.decode("utf-8")
    except OSError as exc:
        raise BadJobFile("", f"cannot read {source}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise BadJobFile("", f"cannot read {source}: not UTF-8 text (byte {exc.start})") from None
    return parse(text, source)


def parse(text: str, source: str = "the job file") -> list[JobSpec]:
    """The specs of the JSON batch ``text``; ``source`` names it in errors.

    Raises:
        InvalidArgument: as :func:`load`.
    """
    try:
        document = values.loads_strict(text)
    except (values.DuplicateKey, values.TooManyDigits) as exc:
        raise BadJobFile("", f"invalid JSON in {source}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise BadJobFile(
            "",
            f"invalid JSON in {source} at line {exc.lineno} column {exc.colno}: {exc.msg}; "
            f"near {values.excerpt(exc.doc, exc.pos)}",
        ) from None
    except RecursionError:  # json's decoder recurses once per level of nesting
        raise BadJobFile("", f"invalid JSON in {source}: nested too deep") from None
    return [_spec(job, i) for i, job in enumerate(_jobs(document, source))]


def _jobs(document: Any, source: str) -> list[Any]:
    """The array of jobs: the document itself, or its ``jobs`` (the whole request body of batchSubmit)."""
    if isinstance(document, list):
        return document
    if not isinstance(document, dict):
        raise BadJobFile(
            "",
            f'{source} must hold a JSON array of jobs or an object {{"jobs": [...]}}, got {values.json_kind(document)}',
        )
    for key in document:
        if key != "jobs":
            raise BadJobFile(key, "unknown field; known fields: jobs")
    jobs = document.get("jobs")
    if not isinstance(jobs, list):
        got = "nothing" if "jobs" not in document else values.json_kind(jobs)
        raise BadJobFile("jobs", f"must be a JSON array of job objects, got {got}")
    return jobs


def _spec(job: Any, index: int) -> JobSpec:
    """The spec of ``jobs[index]``."""
    where = f"jobs[{index}]"
    if not isinstance(job, dict):
        raise BadJobFile(where, f"must be a JSON object, got {values.json_kind(job)}")
    fields: dict[str, Any] = {"type": ""}  # none: the control plane says the type is required
    given_as: dict[str, str] = {}
    for key, value in job.items():
        name = _NAMES.get(key)
        if name is None:
            raise BadJobFile(f"{where}.{key}", f"unknown field; {_KNOWN}")
        if name in given_as:  # {"depends_on": ..., "dependsOn": ...}: which one was meant is not ours to guess
            raise BadJobFile(f"{where}.{key}", f"given twice, also as {given_as[name]}")
        given_as[name] = key
        if value is not None:
            fields[name] = _value(name, value, f"{where}.{key}")
    return JobSpec(**fields)


def _value(name: str, value: Any, where: str) -> Any:
    """``value`` as JobSpec's field ``name`` takes it. Only the kinds of container are checked here (a
    JobSpec would take a list for a mapping and fail obscurely); scalars are ``to_proto``'s."""
    if name in _OBJECTS and not isinstance(value, dict):
        raise BadJobFile(where, f"must be a JSON object, got {values.json_kind(value)}")
    if name in _ARRAYS and not isinstance(value, list):
        raise BadJobFile(where, f"must be a JSON array, got {values.json_kind(value)}")
    if name == "scheduled_at":
        return _when(value, where)
    if name == "notify":
        if not isinstance(value, list):
            raise BadJobFile(where, f"must be a JSON array, got {values.json_kind(value)}")
        return [_notify(target, f"{where}[{i}]") for i, target in enumerate(value)]
    return value


_NOTIFY_KEYS = {"email": "email", "webhook_url": "webhook_url", "webhookUrl": "webhook_url", "on": "on"}


def _notify(target: Any, where: str) -> Notify:
    """A ``notify`` entry: ``{"email": ...}`` or ``{"webhook_url": ...}``, and optionally ``"on": [states]``."""
    if not isinstance(target, dict):
        raise BadJobFile(where, f"must be a JSON object, got {values.json_kind(target)}")
    fields: dict[str, Any] = {}
    for key, value in target.items():
        name = _NOTIFY_KEYS.get(key)
        if name is None:
            raise BadJobFile(f"{where}.{key}", "unknown field; known fields: email, webhook_url, on")
        if name == "on":
            if not isinstance(value, list):
                raise BadJobFile(f"{where}.on", f"must be a JSON array, got {values.json_kind(value)}")
            value = tuple(value)  # each checked as the request is built (Notify's states)
        fields[name] = value
    return Notify(**fields)


def _when(value: Any, where: str) -> Any:
    """A ``scheduled_at``: a string as ``--at`` takes it, or Unix seconds."""
    if isinstance(value, str):
        try:
            return values.when(value)
        except argparse.ArgumentTypeError as exc:
            raise BadJobFile(where, str(exc)) from None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value  # to_proto checks that it is a time a Timestamp holds
    raise BadJobFile(
        where, f"must be a time: ISO 8601 or +30s as a string, or Unix seconds, got {values.json_kind(value)}"
    )
