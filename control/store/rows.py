"""A job's row: the column list, and the conversions between :class:`JobRecord` and a row, shared by
every SQL store (the column order is the same in each schema)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from control import notify
from control.jobs import DEPENDENCY_FAILED, JobRecord, JobState, StartWhen

COLUMNS = (
    "seq, id, name, type, payload, priority, thread_demand, threads_granted, state, attempts, charged_attempts, "
    "max_attempts, timeout_sec, scheduled_at, created_at, ready_at, started_at, finished_at, queue_seconds, "
    "exec_seconds, worker_id, lease_expires_at, result, error_code, error_message, idempotency_key, labels, updated_at, "
    "request_id, owner, worker_selector, output, depends_on, gpu_count, memory_mb, notify, start_when"
)

PAGE_TEXT_BYTES = 10 << 20
"""A page of :meth:`Store.list_jobs` stops before its payloads, results, errors and labels pass
this many characters (it always holds one job): a page of 1,000 jobs with large results would not fit
in memory, nor its ListJobs answer in a gRPC message (64 MiB, where JSON grows up to 5.5 times as a
Struct). Callers page on with ``offset + len(jobs)``."""
_LARGE_COLUMNS = tuple(
    COLUMNS.replace(" ", "").split(",").index(c) for c in ("payload", "result", "error_message", "labels", "output")
)


def insert_row(j: JobRecord) -> tuple[Any, ...]:
    """The values of an INSERT of every column, in COLUMNS order."""
    return (
        j.seq, j.id, j.name, j.type, j.payload_json, j.priority, j.thread_demand, j.threads_granted, int(j.state),
        j.attempts, j.charged_attempts, j.max_attempts, j.timeout_sec, j.scheduled_at, j.created_at, j.ready_at,
        j.started_at, j.finished_at, j.queue_seconds, j.exec_seconds, j.worker_id, j.lease_expires_at, j.result_json,
        j.error_code, j.error_message, j.idempotency_key, json.dumps(j.labels) if j.labels else "{}", j.updated_at,
        j.request_id or "", j.owner, json.dumps(dict(j.worker_selector)) if j.worker_selector else "", j.output,
        " ".join(j.depends_on), j.gpu_count, j.memory_mb, notify.dumps(j.notify) if j.notify else "", int(j.start_when),
    )  # fmt: skip


def update_row(j: JobRecord) -> tuple[Any, ...]:
    """The values of the compare-and-set UPDATE: the changing columns, then the row's key (seq) and the
    attempt. Keyed by seq, the table's own key, rather than by id: one index fewer to search per update."""
    return (
        j.threads_granted, int(j.state), j.attempts, j.charged_attempts, j.ready_at, j.started_at, j.finished_at,
        j.queue_seconds, j.exec_seconds, j.worker_id, j.lease_expires_at, j.result_json, j.error_code,
        j.error_message, j.output, j.updated_at, j.seq, j.attempts,
    )  # fmt: skip


_EMPTY_OBJECT = "{}"


def record(row: Sequence[Any]) -> JobRecord:
    """The job a row of every column (COLUMNS order) holds."""
    (
        seq, id_, name, type_, payload, priority, thread_demand, threads_granted, state, attempts, charged,
        max_attempts, timeout_sec, scheduled_at, created_at, ready_at, started_at, finished_at, queue_seconds,
        exec_seconds, worker_id, lease_expires_at, result, error_code, error_message, idem, labels, updated_at,
        request_id, owner, selector, output, depends_on, gpu_count, memory_mb, targets, start_when,
    ) = row  # fmt: skip
    # Values repeated over many jobs (a type, a worker id, an error code, an empty payload) are one string
    # each, not one per job: a backlog of a million jobs holds them all.
    if payload == _EMPTY_OBJECT:
        payload = _EMPTY_OBJECT
    j = JobRecord(
        id=id_, type=sys.intern(type_), payload_json=payload, created_at=created_at, name=name, priority=priority,
        thread_demand=thread_demand, timeout_sec=timeout_sec, max_attempts=max_attempts, scheduled_at=scheduled_at,
        idempotency_key=idem, labels=json.loads(labels) if labels != "{}" else {}, seq=seq, state=JobState(state),
        ready_at=ready_at, request_id=request_id or None, owner=sys.intern(owner),
        worker_selector=tuple(sorted(json.loads(selector).items())) if selector else (),
        depends_on=tuple(depends_on.split()) if depends_on else (), gpu_count=gpu_count, memory_mb=memory_mb,
        notify=notify.loads(targets) if targets else (),
        start_when=StartWhen(start_when) if start_when else StartWhen.ALL_SUCCEEDED,
    )  # fmt: skip
    j.threads_granted = threads_granted
    j.attempts = attempts
    j.charged_attempts = charged
    j.started_at = started_at
    j.finished_at = finished_at
    j.queue_seconds = queue_seconds
    j.exec_seconds = exec_seconds
    j.worker_id = sys.intern(worker_id)
    j.lease_expires_at = lease_expires_at
    j.result_json = result
    j.error_code = sys.intern(error_code)
    j.error_message = error_message
    j.output = output
    j.updated_at = updated_at
    return j


def first_page(rows: Iterable[Sequence[Any]]) -> list[Sequence[Any]]:
    """The rows of a page, stopping before their large columns pass PAGE_TEXT_BYTES (always one row)."""
    page: list[Sequence[Any]] = []
    size = 0
    for row in rows:
        size += sum(len(row[i]) for i in _LARGE_COLUMNS)
        if page and size > PAGE_TEXT_BYTES:
            break
        page.append(row)
    return page


def chain_below(root: str, links: Iterable[Sequence[str]]) -> list[str]:
    """The ids of the jobs down the chain from ``root``, in no particular order: ``links`` holds ``(id,
    depends_on)`` of each job that may be in it (``depends_on`` as its column keeps it)."""
    below: dict[str, list[str]] = {}
    for job_id, depends_on in links:
        for dep in depends_on.split():
            below.setdefault(dep, []).append(job_id)
    found: dict[str, None] = {}
    frontier = [root]
    while frontier:
        for job_id in below.get(frontier.pop(), ()):
            if job_id not in found:
                found[job_id] = None
                frontier.append(job_id)
    return list(found)


def read_cancelled_chain(conn: Any, placeholder: str, job_id: str) -> list[JobRecord]:
    """:meth:`Store.cancelled_chain` on ``conn`` (a SQLite or PostgreSQL connection, whose parameters are
    written ``placeholder``): one read of the cancelled jobs' dependencies, then the chain's rows."""
    links = conn.execute(
        f"SELECT id, depends_on FROM jobs WHERE state = {placeholder} AND error_code = {placeholder}",
        (int(JobState.CANCELLED), DEPENDENCY_FAILED),
    ).fetchall()
    return sorted(read_by_ids(conn, placeholder, chain_below(job_id, links)), key=lambda job: job.seq)


def read_by_ids(conn: Any, placeholder: str, ids: Sequence[str]) -> list[JobRecord]:
    """The stored jobs among ``ids`` (in no particular order; ids that name none are left out), read
    500 at a time so that no statement passes SQLite's limit on parameters."""
    out: list[JobRecord] = []
    for at in range(0, len(ids), 500):
        part = list(ids[at : at + 500])
        marks = ",".join([placeholder] * len(part))
        out.extend(record(row) for row in conn.execute(f"SELECT {COLUMNS} FROM jobs WHERE id IN ({marks})", part))
    return out


def purge_window(placeholder: str) -> str:
    """The query of one purge step: (state, after seq, limit) -> the rows :func:`purge_doomed` takes."""
    p = placeholder
    return (
        f"SELECT seq, id, finished_at, created_at, error_code, labels FROM jobs "
        f"WHERE state = {p} AND seq > {p} ORDER BY seq LIMIT {p}"
    )


def purge_doomed(
    rows: Sequence[Sequence[Any]], before: float, dependency_failed_before: float | None, limit: int
) -> tuple[list[tuple[int, str, str]], int | None]:
    """Of a purge step's rows (:func:`purge_window`), the ``(seq, id, labels)`` of those past their
    retention, and where the next step starts (None: the rows ran out, or reached jobs submitted after
    both cut-offs, which cannot have finished by then); see :meth:`Store.purge_finished`."""
    doomed: list[tuple[int, str, str]] = []
    for seq, job_id, finished, _, code, labels in rows:
        cutoff = before if dependency_failed_before is None or code != DEPENDENCY_FAILED else dependency_failed_before
        if finished is not None and finished <= cutoff:
            doomed.append((seq, job_id, labels))
    latest = before if dependency_failed_before is None else max(before, dependency_failed_before)
    more = len(rows) == limit and rows[-1][3] <= latest
    return doomed, (int(rows[-1][0]) if more else None)
