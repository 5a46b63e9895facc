"""The client commands of ``corral``: submit, submit-many, get, list, cancel, retry, watch, stats, workers,
drain, audit (the account commands are in :mod:`corral.cli.account_commands`).

Each handler takes the parsed arguments, makes one :class:`corral.Client` call
and prints a table or, with ``--json``, JSON. Errors are not caught here:
:func:`corral.cli.main.main` turns a :class:`corral.errors.CorralError` into one line on stderr and the
exit status.

The token a command sends is ``--token``, else ``$CORRAL_TOKEN`` (both through the parser), else the one
``corral login`` saved (:mod:`corral.cli.login_file`), while it has not expired and only to the
``--control`` it was made with: a token is never sent to a control plane it was not made for.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing, contextmanager
from datetime import UTC, datetime
from typing import Any

from rich.markup import escape

from corral.cli import job_file, login_file, render
from corral.cli.exitcode import ExitCode, fail
from corral.client import Client
from corral.errors import InvalidArgument, Unavailable
from corral.job import Changed, Job, JobState
from corral.job_ids import MAX_WATCHED_JOBS
from corral.limits import MAX_CANCELLED_PER_CALL, MAX_RETRIED_PER_CALL

__all__ = [
    "audit",
    "cancel",
    "client_for",
    "drain",
    "get",
    "list_jobs",
    "output",
    "queue",
    "retry",
    "stats",
    "submit",
    "submit_many",
    "wait",
    "watch",
    "workers",
]


def submit(args: argparse.Namespace) -> int:
    """``corral submit TYPE``: submit one job; with ``--wait``, wait for it (in the same call, RunJob) and
    exit 1 unless it SUCCEEDED; with ``--follow``, print what it prints until it ends, then the same."""
    fields: dict[str, Any] = {
        "name": args.name,
        "priority": args.priority,
        "thread_demand": args.threads,
        "timeout_sec": args.timeout,
        "max_attempts": args.max_attempts,
        "scheduled_at": args.at,
        "idempotency_key": args.idempotency_key,
        "labels": dict(args.label),
        "worker_selector": dict(args.worker_selector),
        "depends_on": args.depends_on,
        "gpu_count": args.gpu_count,
        "memory_mb": args.memory_mb,
        "notify": [dataclasses.replace(target, on=tuple(args.notify_on)) for target in args.notify],
        "start_when": args.start_when,
    }
    with _given_as(_SUBMIT_FLAGS), client_for(args) as client:
        if args.follow:
            job = client.submit(args.type, args.payload, **fields)
            if not args.json:
                print(f"Submitted job {job.id} ({job.type})", file=sys.stderr, flush=True)
            with _goes_on(job.id):
                _print_output(client, job.id, args.json)
                job = client.get(job.id)  # the watch ended with the job
            if args.json:
                render.print_json_line(job.to_dict())
            return ExitCode.OK if job.state is JobState.SUCCEEDED else fail(_ending(job))
        if args.wait:
            accepted: list[str] = []  # the job's id, once the first event said it was accepted
            with _goes_on(accepted):
                if args.json:
                    with closing(client.submit_and_watch(args.type, args.payload, **fields)) as updates:
                        for job in updates:
                            accepted[:] = [job.id]
                else:
                    err = render.console(stderr=True)
                    with (
                        err.status(f"Submitting a {escape(args.type)} job...") as status,
                        closing(client.submit_and_watch(args.type, args.payload, **fields)) as updates,
                    ):
                        for job in updates:
                            if not accepted:  # said above the spinner, which is erased at the end
                                accepted[:] = [job.id]
                                err.print(f"Submitted job {job.id} ({job.type})", markup=False, highlight=False)
                            status.update(f"Job {job.id} ({escape(job.type)}) is {job.state.name}...")
            return _show_final(job, args.json)
        job = client.submit(args.type, args.payload, **fields)
    if args.json:
        render.print_json(job.to_dict())
    else:
        out = render.console()
        out.print(f"Submitted job [bold]{job.id}[/] ({escape(job.type)}, ", render.state_text(job.state), ")", sep="")
    return ExitCode.OK


_SUBMIT_FLAGS = {
    "type": "TYPE",
    "payload": "--payload",
    "name": "--name",
    "priority": "--priority",
    "thread_demand": "--threads",
    "timeout_sec": "--timeout",
    "max_attempts": "--max-attempts",
    "scheduled_at": "--at",
    "idempotency_key": "--idempotency-key",
    "labels": "--label",
    "worker_selector": "--on",
    "depends_on": "--after",
    "start_when": "--start-when",
    "gpu_count": "--gpus",
    "memory_mb": "--memory-mb",
    "notify": "--notify",
}
"""The field of a submission -> the ``corral submit`` argument that gives it."""


@contextmanager
def _given_as(flags: dict[str, str]) -> Iterator[None]:
    """Inside the block, an :class:`InvalidArgument` on a field (whoever found it) says which argument of
    ``flags`` gave it (``field 'thread_demand': ...; given as --threads``): the request's field names are
    not always the command line's."""
    try:
        yield
    except InvalidArgument as exc:
        top = re.split(r"[.\[]", exc.field, maxsplit=1)[0]
        flag = "--notify-on" if top == "notify" and ".on" in exc.field else flags.get(top)
        if flag is not None:
            exc.add_note(f"given as {flag}")
        raise


@contextmanager
def _goes_on(job: str | list[str]) -> Iterator[None]:
    """Inside the block, a Ctrl-C or an unreachable control plane (the outage limit) after job ``job`` was
    accepted (a list: empty until then) says that the job goes on, and how to follow it: it was
    accepted, and runs whether or not this command waits (``corral: error: interrupted; job X ...``)."""
    try:
        yield
    except (KeyboardInterrupt, Unavailable) as exc:
        ids = [job] if isinstance(job, str) else job
        if ids:
            exc.add_note(f"job {ids[0]} was accepted and goes on: follow it with `corral watch {ids[0]}`")
        raise


def submit_many(args: argparse.Namespace) -> int:
    """``corral submit-many FILE``: submit the jobs of a JSON file (``-``: stdin) in one SubmitJobs batch, all
    or none (:mod:`corral.cli.job_file` reads it, and refuses a bad one before anything is sent); with
    ``--wait``, wait for every one to end and exit 1 unless all SUCCEEDED."""
    specs = job_file.load(args.file)
    with client_for(args) as client:
        jobs = client.submit_many(specs)
        if args.wait:
            jobs = _wait_all(client, [job.id for job in jobs], progress=not args.json)
    if args.json:
        render.print_json([job.to_dict() for job in jobs])
    else:
        render.console().print(render.batch_table(jobs))
    unsuccessful = [job for job in jobs if job.state is not JobState.SUCCEEDED]
    if not args.wait or not unsuccessful:
        return ExitCode.OK
    # The first by place is most often the cause: a job's dependents come after it in a batch.
    return fail(f"{len(unsuccessful)} of {len(jobs)} jobs did not succeed; {_ending(unsuccessful[0])}")


def _wait_all(client: Client, ids: list[str], *, progress: bool, timeout: float | None = None) -> list[Job]:
    """The jobs ``ids`` name as they ended, in the same order (an id may repeat); ``progress``: say on
    stderr how many have ended. One WatchJobs stream per MAX_WATCHED_JOBS of them, in turn."""
    unique = list(dict.fromkeys(ids))
    ended: dict[str, Job] = {}
    deadline = None if timeout is None else time.monotonic() + timeout
    with ExitStack() as stack:
        status = stack.enter_context(render.console(stderr=True).status("Waiting...")) if progress else None
        for at in range(0, len(unique), MAX_WATCHED_JOBS):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            part = unique[at : at + MAX_WATCHED_JOBS]
            with closing(client.watch_many(part, ends_only=True, timeout=left)) as ends:
                for job in ends:
                    ended[job.id] = job
                    if status is not None:
                        status.update(f"Waiting: {len(ended):,} of {len(unique):,} jobs ended...")
    return [ended[job_id] for job_id in ids]


def wait(args: argparse.Namespace) -> int:
    """``corral wait ID [ID ...]``: wait until every job has ended, across control-plane restarts; a table of
    them as they ended (``--json``: a list); exit 1 unless all SUCCEEDED, naming the first that did not."""
    with client_for(args) as client:
        jobs = _wait_all(client, args.ids, progress=not args.json, timeout=args.timeout)
    if args.json:
        render.print_json([job.to_dict() for job in jobs])
    else:
        render.console().print(render.jobs_table(jobs))
    unsuccessful = [job for job in jobs if job.state is not JobState.SUCCEEDED]
    if not unsuccessful:
        return ExitCode.OK
    return fail(f"{len(unsuccessful)} of {len(jobs)} jobs did not succeed; {_ending(unsuccessful[0])}")


def get(args: argparse.Namespace) -> int:
    """``corral get ID``: show one job."""
    with client_for(args) as client:
        job = client.get(args.id)
    _show(job, args.json)
    return ExitCode.OK


def output(args: argparse.Namespace) -> int:
    """``corral output ID``: what the job's latest attempt printed, as it is (``--json``: with the state);
    with ``--follow``, what it prints as it prints it until it ends (``--json``: one chunk per line)."""
    if args.follow:
        return _follow_output(args)
    with client_for(args) as client:
        job = client.get(args.id)
    if args.json:
        render.print_json({"id": job.id, "state": job.state.name, "attempts": job.attempts, "output": job.output})
    else:
        sys.stdout.write(job.output)
    return ExitCode.OK


def _follow_output(args: argparse.Namespace) -> int:
    """``corral output --follow ID``: what the job prints, as it prints it, until it ends."""
    with client_for(args) as client:
        _print_output(client, args.id, args.json)
    return ExitCode.OK


def _print_output(client: Client, job_id: str, as_json: bool) -> None:
    """Print what job ``job_id`` prints, as it prints it, until it ends: its text on stdout and, on
    stderr, a line where another attempt starts and where text was left out, so that stdout stays the
    job's own text (``as_json``: one chunk per line on stdout)."""
    attempt = 0
    ends: dict[int, int] = {}
    with closing(client.watch_output(job_id)) as chunks:
        for chunk in chunks:
            if as_json:
                render.print_json_line({"attempt": chunk.attempt, "offset": chunk.offset, "text": chunk.text})
                continue
            if chunk.attempt != attempt:
                if attempt:
                    sys.stdout.flush()
                    print(f"--- attempt {chunk.attempt} ---", file=sys.stderr, flush=True)
                attempt = chunk.attempt
            if (left_out := chunk.offset - ends.get(chunk.attempt, 0)) > 0:
                sys.stdout.flush()
                print(f"[... {left_out} characters left out]", file=sys.stderr, flush=True)
            ends[chunk.attempt] = chunk.end
            sys.stdout.write(chunk.text)
            sys.stdout.flush()


def list_jobs(args: argparse.Namespace) -> int:
    """``corral list``: a page of jobs, newest first."""
    states = [state for group in args.status for state in group]
    with client_for(args) as client:
        page = client.list(
            status=states,
            type=args.type,
            limit=args.limit,
            offset=args.offset,
            owner=args.owner,
            labels=dict(args.label),
            error_code=args.error_code,
        )
    if args.json:
        render.print_json({"jobs": [j.to_dict() for j in page.jobs], "total": page.total})
        return ExitCode.OK
    out = render.console()
    out.print(render.jobs_table(page.jobs))
    out.print(_page_footer(len(page.jobs), page.total, args.offset, "jobs"))
    return ExitCode.OK


def queue(args: argparse.Namespace) -> int:
    """``corral queue``: PENDING jobs in the order workers will get them, with estimated starts."""
    with client_for(args) as client:
        page = client.queue(
            type=args.type, limit=args.limit, offset=args.offset, owner=args.owner, labels=dict(args.label)
        )
    if args.json:
        render.print_json({"jobs": [j.to_dict() for j in page.jobs], "total": page.total})
        return ExitCode.OK
    out = render.console()
    out.print(render.queue_table(page.jobs, datetime.now(UTC)))
    out.print(_page_footer(len(page.jobs), page.total, args.offset, "queued jobs"))
    return ExitCode.OK


def _page_footer(count: int, total: int, offset: int, noun: str) -> str:
    """``1-50 of 120 jobs; next page: --offset 50``, dimmed: ``count`` shown from ``offset``, of ``total``;
    ``no jobs`` when none matched at all."""
    if not total:
        return f"[dim]no {noun}[/]"
    end = offset + count
    shown = f"{offset + 1}-{end}" if count else "none"
    more = f"; next page: --offset {end}" if count and end < total else ""
    return f"[dim]{shown} of {total} {noun}{more}[/]"


def cancel(args: argparse.Namespace) -> int:
    """``corral cancel ID``: cancel a job that has not finished. With several ids or a filter: every
    unfinished job that matches, 10,000 to a CancelJobs call (``--limit``: at most that many in all)."""
    states = [state for group in args.status for state in group]
    filters = {"status": states, "type": args.type, "owner": args.owner, "labels": dict(args.label), "all": args.all}
    if len(args.ids) == 1 and not any(filters.values()) and not args.limit:
        with client_for(args) as client:
            job = client.cancel(args.ids[0])
        _show_brief(job, "Cancelled", args.json)
        return ExitCode.OK

    def call(client: Client, ids: list[str] | None, limit: int) -> Changed:
        return client.cancel_many(ids, limit=limit, **filters)

    return _change_many(args, call, MAX_CANCELLED_PER_CALL, "cancelled", again=True)


def retry(args: argparse.Namespace) -> int:
    """``corral retry ID``: re-drive a FAILED job. With several ids or a filter: every FAILED job that
    matches, 1,000 to a RetryJobs call (``--limit``: at most that many in all; a filter makes one call,
    so 1,000 at most a run)."""
    filters = {
        "type": args.type,
        "owner": args.owner,
        "labels": dict(args.label),
        "all": args.all,
        "error_code": args.error_code,
    }
    if len(args.ids) == 1 and not any(filters.values()) and not args.limit:
        with client_for(args) as client:
            job = client.retry(args.ids[0])
        _show_brief(job, "Retrying", args.json)
        return ExitCode.OK

    def call(client: Client, ids: list[str] | None, limit: int) -> Changed:
        return client.retry_many(ids, limit=limit, **filters)

    # One call per 1,000 named ids, or one call for a filter: a job re-driven here may fail again at
    # once, and a call after would re-drive it a second time.
    return _change_many(args, call, MAX_RETRIED_PER_CALL, "retried", again=False)


def _change_many(
    args: argparse.Namespace,
    call: Callable[[Client, list[str] | None, int], Changed],
    per_call: int,
    done: str,
    again: bool,
) -> int:
    """Call ``call`` (a cancel_many or retry_many of the command's filters) for each ``per_call`` of the
    named ids, or once for a filter; with ``again``, call again while more match (a job changed cannot
    match again: a cancelled one stays cancelled). Never past ``--limit`` jobs in all. Prints how many
    were ``done`` (``--json``: their ids) and how many more matched."""
    changed: list[str] = []
    remaining = 0
    with client_for(args) as client:
        for part in _id_chunks(args.ids, min(per_call, MAX_WATCHED_JOBS)):
            while not args.limit or len(changed) < args.limit:
                left = args.limit - len(changed) if args.limit else per_call
                answer = call(client, part, min(left, per_call))
                changed += answer.ids
                remaining = answer.remaining
                if not again or not remaining or not answer.ids:  # done, or what is left cannot be changed
                    break
    if args.json:
        render.print_json({done: changed, "remaining": remaining})
    else:
        more = f"; {remaining:,} more match" if remaining else ""
        render.console().print(f"{done.capitalize()} {len(changed):,} job{'' if len(changed) == 1 else 's'}{more}")
    return ExitCode.OK


def _id_chunks(ids: list[str], size: int) -> list[list[str] | None]:
    """The ids a command names, ``size`` to a call (one call of None: it names none)."""
    if not ids:
        return [None]
    return [ids[at : at + size] for at in range(0, len(ids), size)]


def watch(args: argparse.Namespace) -> int:
    """``corral watch ID``: print every change until the job is terminal; exit 1 unless it SUCCEEDED."""
    out = render.console()
    last: Job | None = None
    with client_for(args) as client, closing(client.watch(args.id)) as updates:
        for job in updates:
            if args.json:
                render.print_json_line(job.to_dict())
            else:
                out.print(render.job_line(job))
            last = job
    if last is None or not last.is_terminal:
        return fail(f"watch of job {args.id!r} ended before the job finished")
    if last.state is JobState.SUCCEEDED:
        return ExitCode.OK
    return fail(_ending(last))


def stats(args: argparse.Namespace) -> int:
    """``corral stats``: queue depth, workers, jobs by status, success rate, uptime."""
    with client_for(args) as client:
        value = client.stats()
    if args.json:
        render.print_json(value.to_dict())
    else:
        render.console().print(render.stats_table(value))
    return ExitCode.OK


def workers(args: argparse.Namespace) -> int:
    """``corral workers``: the registered workers."""
    with client_for(args) as client:
        found = client.workers()
    if args.json:
        render.print_json([w.to_dict() for w in found])
    else:
        render.console().print(render.workers_table(found))
    return ExitCode.OK


def shares(args: argparse.Namespace) -> int:
    """``corral shares``: each share of the cluster, lowest fair-share rank first (admins only)."""
    with client_for(args) as client:
        found = client.shares()
    if args.json:
        render.print_json(found.to_dict())
    else:
        render.console().print(render.shares_table(found))
    return ExitCode.OK


def audit(args: argparse.Namespace) -> int:
    """``corral audit``: the audit log, newest first (admins only)."""
    with client_for(args) as client:
        page = client.audit(
            actor=args.actor,
            action=args.action,
            target=args.target,
            outcome=args.outcome,
            limit=args.limit,
            offset=args.offset,
        )
    if args.json:
        render.print_json({"events": [e.to_dict() for e in page.events], "total": page.total})
        return ExitCode.OK
    out = render.console()
    out.print(render.audit_table(page.events))
    out.print(_page_footer(len(page.events), page.total, args.offset, "events"))
    return ExitCode.OK


def drain(args: argparse.Namespace) -> int:
    """``corral drain WORKER_ID``: stop giving the worker jobs; it finishes what it runs and leaves."""
    with client_for(args) as client:
        worker = client.drain_worker(args.id)
    if args.json:
        render.print_json(worker.to_dict())
    else:
        render.console().print(f"Draining worker [bold]{worker.id}[/] ({len(worker.running_jobs)} jobs running)")
    return ExitCode.OK


def client_for(args: argparse.Namespace) -> Client:
    """The client a command's arguments ask for, with the token it should send (see the module docstring)."""
    return Client(args.control, timeout=args.rpc_timeout, token=token_for(args), tls_ca=args.tls_ca)


def token_for(args: argparse.Namespace) -> str | None:
    """``--token`` or ``$CORRAL_TOKEN`` (the parser's default), else the saved login's token when it was made
    with this ``--control`` and has not expired (otherwise it is left alone, and no token is sent)."""
    if args.token:
        return str(args.token)
    saved = login_file.load()
    if saved is not None and saved.usable(args.control, datetime.now(UTC)):
        return saved.token
    return None


def _show(job: Job, as_json: bool) -> None:
    if as_json:
        render.print_json(job.to_dict())
    else:
        render.console().print(render.job_table(job))


def _show_brief(job: Job, verb: str, as_json: bool) -> None:
    if as_json:
        render.print_json(job.to_dict())
    else:
        render.console().print(f"{verb} job [bold]{job.id}[/] (", render.state_text(job.state), ")", sep="")


def _show_final(job: Job, as_json: bool) -> int:
    _show(job, as_json)
    return ExitCode.OK if job.state is JobState.SUCCEEDED else fail(_ending(job))


def _ending(job: Job) -> str:
    reason = f": {job.error.code}: {job.error.message}" if job.error else ""
    return f"job {job.id!r} ended {job.state.name}{reason}"
