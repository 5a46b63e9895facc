"""The client commands of ``corral``: submit, get, list, cancel, retry, watch, stats, workers, drain, and
the account commands login, logout, whoami, register, accounts (list, passwd, delete).

Each handler takes the parsed arguments, makes one :class:`corral.Client` call (two for ``submit --wait``
and ``accounts passwd``) and prints a table or, with ``--json``, JSON. Errors are not caught here:
:func:`corral.cli.main.main` turns a :class:`corral.errors.CorralError` into one line on stderr and the
exit status.

The token a command sends is ``--token``, else ``$CORRAL_TOKEN`` (both through the parser), else the one
``corral login`` saved (:mod:`corral.cli.login_file`), while it has not expired and only to the
``--control`` it was made with: a token is never sent to a control plane it was not made for.
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import closing
from datetime import UTC, datetime
from getpass import getpass

from corral.cli import login_file, render
from corral.cli.exitcode import ExitCode, fail
from corral.cli.login_file import SavedLogin
from corral.client import Client
from corral.job import Job, JobPage, JobState

__all__ = [
    "cancel",
    "delete_account",
    "drain",
    "get",
    "list_accounts",
    "list_jobs",
    "login",
    "logout",
    "output",
    "passwd",
    "queue",
    "register",
    "retry",
    "stats",
    "submit",
    "watch",
    "whoami",
    "workers",
]


def submit(args: argparse.Namespace) -> int:
    """``corral submit TYPE``: submit one job; with ``--wait``, wait for it and exit 1 unless it SUCCEEDED."""
    with _client(args) as client:
        job = client.submit(
            args.type,
            args.payload,
            name=args.name,
            priority=args.priority,
            thread_demand=args.threads,
            timeout_sec=args.timeout,
            max_attempts=args.max_attempts,
            scheduled_at=args.at,
            idempotency_key=args.idempotency_key,
            labels=dict(args.label),
            worker_selector=dict(args.worker_selector),
            depends_on=args.depends_on,
            gpu_count=args.gpu_count,
            memory_mb=args.memory_mb,
        )
        if not args.wait:
            if args.json:
                render.print_json(job.to_dict())
            else:
                out = render.console()
                out.print(f"Submitted job [bold]{job.id}[/] ({job.type}, ", render.state_text(job.state), ")", sep="")
            return ExitCode.OK
        if args.json:
            job = client.wait(job.id)
        else:
            with render.console(stderr=True).status(f"Waiting for job {job.id} ({job.type})..."):
                job = client.wait(job.id)
    return _show_final(job, args.json)


def get(args: argparse.Namespace) -> int:
    """``corral get ID``: show one job."""
    with _client(args) as client:
        job = client.get(args.id)
    _show(job, args.json)
    return ExitCode.OK


def output(args: argparse.Namespace) -> int:
    """``corral output ID``: what the job's latest attempt printed, as it is (``--json``: with the state)."""
    with _client(args) as client:
        job = client.get(args.id)
    if args.json:
        render.print_json({"id": job.id, "state": job.state.name, "attempts": job.attempts, "output": job.output})
    else:
        sys.stdout.write(job.output)
    return ExitCode.OK


def list_jobs(args: argparse.Namespace) -> int:
    """``corral list``: a page of jobs, newest first."""
    states = [state for group in args.status for state in group]
    with _client(args) as client:
        page = client.list(status=states, type=args.type, limit=args.limit, offset=args.offset, owner=args.owner)
    if args.json:
        render.print_json({"jobs": [j.to_dict() for j in page.jobs], "total": page.total})
        return ExitCode.OK
    out = render.console()
    out.print(render.jobs_table(page.jobs))
    out.print(_page_footer(page, args.offset, "jobs"))
    return ExitCode.OK


def queue(args: argparse.Namespace) -> int:
    """``corral queue``: PENDING jobs in the order workers will get them, with estimated starts."""
    with _client(args) as client:
        page = client.queue(type=args.type, limit=args.limit, offset=args.offset, owner=args.owner)
    if args.json:
        render.print_json({"jobs": [j.to_dict() for j in page.jobs], "total": page.total})
        return ExitCode.OK
    out = render.console()
    out.print(render.queue_table(page.jobs, datetime.now(UTC)))
    out.print(_page_footer(page, args.offset, "queued jobs"))
    return ExitCode.OK


def _page_footer(page: JobPage, offset: int, noun: str) -> str:
    """``1-50 of 120 jobs; next page: --offset 50``, dimmed."""
    end = offset + len(page.jobs)
    shown = f"{offset + 1}-{end}" if page.jobs else "none"
    more = f"; next page: --offset {end}" if page.jobs and end < page.total else ""
    return f"[dim]{shown} of {page.total} {noun}{more}[/]"


def cancel(args: argparse.Namespace) -> int:
    """``corral cancel ID``: cancel a job that has not finished."""
    with _client(args) as client:
        job = client.cancel(args.id)
    _show_brief(job, "Cancelled", args.json)
    return ExitCode.OK


def retry(args: argparse.Namespace) -> int:
    """``corral retry ID``: re-drive a FAILED job."""
    with _client(args) as client:
        job = client.retry(args.id)
    _show_brief(job, "Retrying", args.json)
    return ExitCode.OK


def watch(args: argparse.Namespace) -> int:
    """``corral watch ID``: print every change until the job is terminal; exit 1 unless it SUCCEEDED."""
    out = render.console()
    last: Job | None = None
    with _client(args) as client, closing(client.watch(args.id)) as updates:
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
    with _client(args) as client:
        value = client.stats()
    if args.json:
        render.print_json(value.to_dict())
    else:
        render.console().print(render.stats_table(value))
    return ExitCode.OK


def workers(args: argparse.Namespace) -> int:
    """``corral workers``: the registered workers."""
    with _client(args) as client:
        found = client.workers()
    if args.json:
        render.print_json([w.to_dict() for w in found])
    else:
        render.console().print(render.workers_table(found))
    return ExitCode.OK


def drain(args: argparse.Namespace) -> int:
    """``corral drain WORKER_ID``: stop giving the worker jobs; it finishes what it runs and leaves."""
    with _client(args) as client:
        worker = client.drain_worker(args.id)
    if args.json:
        render.print_json(worker.to_dict())
    else:
        render.console().print(f"Draining worker [bold]{worker.id}[/] ({len(worker.running_jobs)} jobs running)")
    return ExitCode.OK


class _BadInput(Exception):
    """Passwords that cannot be sent (two that differ, stdin that ended early); the message is the error line."""


def login(args: argparse.Namespace) -> int:
    """``corral login NAME``: log in and save the login for the client commands (``--print``: print the token
    and save nothing)."""
    try:
        password = _stdin_lines(1)[0] if args.password_stdin else _ask("Password: ")
    except _BadInput as exc:
        return fail(str(exc))
    # Sent without a token: Login needs none, and a stale one (an expired login, an old $CORRAL_TOKEN)
    # must not stand between the user and a new login.
    with Client(args.control, timeout=args.rpc_timeout, tls_ca=args.tls_ca) as client:
        value = client.login(args.name, password)
    name = value.account.name or args.name
    if args.print:
        if args.json:
            render.print_json(
                {"name": name, "expires_at": value.expires_at.isoformat(), "token": value.token, "saved_to": None}
            )
        else:
            print(value.token, flush=True)
        return ExitCode.OK
    saved_to = login_file.save(SavedLogin(args.control, name, value.token, value.expires_at))
    if args.json:
        render.print_json({"name": name, "expires_at": value.expires_at.isoformat(), "saved_to": str(saved_to)})
    else:
        print(f"logged in as {name} until {render.utc_time(value.expires_at)} (saved to {saved_to})", flush=True)
    from corral.cli.parser import TOKEN_ENV  # here, not at the top: the parser imports this module

    if os.environ.get(TOKEN_ENV):
        print(f"corral: note: ${TOKEN_ENV} is set: the client commands send it, not this login", file=sys.stderr)
    return ExitCode.OK


def logout(args: argparse.Namespace) -> int:
    """``corral logout``: remove the saved login; says whether there was one (exit 0 either way)."""
    file = login_file.path()
    if login_file.remove(file):
        print(f"logged out: removed {file}", flush=True)
    else:
        print(f"not logged in: there is no {file}", flush=True)
    return ExitCode.OK


def whoami(args: argparse.Namespace) -> int:
    """``corral whoami``: who the control plane takes the caller for."""
    with _client(args) as client:
        identity = client.whoami()
    if args.json:
        render.print_json(identity.to_dict())
    else:
        render.console().print(render.identity_table(identity, datetime.now(UTC)))
    return ExitCode.OK


def register(args: argparse.Namespace) -> int:
    """``corral register NAME``: create an account (the password asked twice, or one line of stdin)."""
    try:
        password = _stdin_lines(1)[0] if args.password_stdin else _new_password()
    except _BadInput as exc:
        return fail(str(exc))
    with _client(args) as client:
        account = client.register(args.name, password)
    if args.json:
        render.print_json(account.to_dict())
    else:
        render.console().print(f"Registered account [bold]{account.name}[/]")
    return ExitCode.OK


def list_accounts(args: argparse.Namespace) -> int:
    """``corral accounts``: every account (admins only)."""
    with _client(args) as client:
        found = client.accounts()
    if args.json:
        render.print_json([a.to_dict() for a in found])
    else:
        render.console().print(render.accounts_table(found))
    return ExitCode.OK


def passwd(args: argparse.Namespace) -> int:
    """``corral accounts passwd [NAME]``: change one's own password (the current one, then the new one), or
    reset another account's as an admin (the new one only). NAME defaults to the caller's own account."""
    with _client(args) as client:
        # WhoAmI says whether NAME is the caller's own account, which needs the current password too
        identity = client.whoami()
        own = identity.account.name if identity.account is not None else None
        name = args.name or own
        if name is None:
            return fail(
                "you are not logged in to an account here (corral login NAME), so name the one whose password "
                "to reset: corral accounts passwd NAME"
            )
        try:
            if name != own:
                current = ""
                new = _stdin_lines(1)[0] if args.password_stdin else _new_password()
            elif args.password_stdin:
                current, new = _stdin_lines(2)
            else:
                current = _ask("Current password: ")
                new = _new_password()
        except _BadInput as exc:
            return fail(str(exc))
        account = client.set_password(name, new, current_password=current)
    if args.json:
        render.print_json(account.to_dict())
    elif name == own:
        out = render.console()
        out.print(
            f"Changed the password of [bold]{name}[/]; your logins have ended (log in again: corral login {name})"
        )
    else:
        render.console().print(f"Reset the password of [bold]{name}[/]; its logins have ended")
    return ExitCode.OK


def delete_account(args: argparse.Namespace) -> int:
    """``corral accounts delete NAME``: delete an account and end its logins (its jobs stay)."""
    with _client(args) as client:
        client.delete_account(args.name)
    if args.json:
        render.print_json({"deleted": args.name})
    else:
        render.console().print(f"Deleted account [bold]{args.name}[/]")
    return ExitCode.OK


def _new_password() -> str:
    """A new password, asked twice."""
    first = _ask("New password: ")
    if _ask("New password again: ") != first:
        raise _BadInput("the two passwords typed differ")
    return first


def _ask(prompt: str) -> str:
    """A password typed at the terminal, not echoed."""
    try:
        return getpass(prompt)
    except EOFError:  # Ctrl-D, or stdin ended where getpass had no terminal: not a traceback
        raise _BadInput("no password given") from None


def _stdin_lines(count: int) -> list[str]:
    """The first ``count`` lines of stdin, each without its line ending and nothing else (a password may
    start or end with spaces)."""
    lines: list[str] = []
    for number in range(1, count + 1):
        line = sys.stdin.readline()
        if not line:
            raise _BadInput(f"--password-stdin: stdin ended before line {number} of {count}")
        lines.append(line.removesuffix("\n").removesuffix("\r"))
    return lines


def _client(args: argparse.Namespace) -> Client:
    return Client(args.control, timeout=args.rpc_timeout, token=_token(args), tls_ca=args.tls_ca)


def _token(args: argparse.Namespace) -> str | None:
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
