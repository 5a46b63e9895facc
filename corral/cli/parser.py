"""The ``corral`` command line: every sub-command, its arguments, and the handler it runs.

Each sub-parser sets ``handler`` (a function of the parsed ``argparse.Namespace`` returning the exit
status), and may set ``check``, run on the parsed arguments before the handler, for a usage error that
no one argument shows alone (it exits 2 through the sub-parser's ``error``, as argparse does). The
client commands share ``--control``, ``--token``, ``--tls-ca``, ``--json`` and ``--rpc-timeout``
through one parent parser.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from corral.audit import ACTIONS as AUDIT_ACTIONS
from corral.cli import account_commands, commands, demo, login_file, up, values
from corral.client import DEFAULT_ADDRESS
from corral.logs import FORMATS, LEVELS

__all__ = ["CONTROL_ADDR_ENV", "PASSTHROUGH", "TLS_CA_ENV", "TOKEN_ENV", "build_parser"]

CONTROL_ADDR_ENV = "CORRAL_CONTROL_ADDR"
"""Environment variable with the default ``--control`` address."""
TOKEN_ENV = "CORRAL_TOKEN"
"""Environment variable with the default ``--token`` (the variable keeps the token out of ``ps``); without
either, a client command sends the token ``corral login`` saved (:mod:`corral.cli.login_file`)."""
TLS_CA_ENV = "CORRAL_TLS_CA"
"""Environment variable with the default ``--tls-ca``."""

PASSTHROUGH = {"control": "control", "worker": "worker", "backup": "control.backup"}
"""Sub-commands that exec ``python -m MODULE`` with the rest of the command line."""
PASSTHROUGH_HELP = {
    "control": "run a control plane (`python -m control`; --help for its flags)",
    "worker": "run a worker (`python -m worker`; --help for its flags)",
    "backup": "copy the store consistently while its control plane runs (`corral backup --help`)",
}

_EPILOG = """\
exit status: 0 ok; 1 the server refused or failed the request (or a waited-for job did not succeed);
2 bad input (a bad command line or job file, or a value the client or the control plane refused as
INVALID_ARGUMENT); 3 the control plane cannot be reached.
"""


class _Pairs(argparse.Action):
    """``append`` for ``K=V`` options (``--label``, ``--on``): a key given again with another value is a
    usage error naming both, where a dict of them kept the last and dropped the first without a word
    (the same key with the same value again changes nothing, and is taken)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        assert isinstance(values, tuple)
        key, value = values
        pairs = list(getattr(namespace, self.dest, None) or [])  # a copy: the default list is shared
        for old_key, old_value in pairs:
            if old_key == key and old_value != value:
                raise argparse.ArgumentError(
                    self, f"key {key!r} given twice ({key}={old_value} and {key}={value}): give each key once"
                )
        pairs.append((key, value))
        setattr(namespace, self.dest, pairs)


def build_parser() -> argparse.ArgumentParser:
    """The complete ``corral`` parser."""
    parser = argparse.ArgumentParser(
        prog="corral",
        description="Corral: a distributed job scheduler. Run it, submit jobs, watch them.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_up(sub)
    _add_demo(sub)
    for name in PASSTHROUGH:
        p = sub.add_parser(name, help=PASSTHROUGH_HELP[name], add_help=False)
        p.add_argument("args", nargs=argparse.REMAINDER)
    p = sub.add_parser(
        "config",
        help="check the configuration: every setting, its variable, value and source (--worker: a worker's)",
        add_help=False,  # `corral config` runs corral.cli.config_check.main, which has its own --help
    )
    p.add_argument("args", nargs=argparse.REMAINDER)
    parent = _client_parent()
    _add_client_commands(sub, parent)
    _add_account_commands(sub, parent)
    return parser


def _add_up(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "up",
        help="run a control plane and workers in the foreground (Ctrl-C stops them)",
        description="Run a control plane and N workers as child processes until Ctrl-C or SIGTERM.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    p.add_argument("--grpc-port", type=values.port, default=50051, help="gRPC port, 0 = any free (default %(default)s)")
    p.add_argument("--http-port", type=values.port, default=8080, help="HTTP port, 0 = any free (default %(default)s)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default %(default)s)")
    p.add_argument("--threads", type=values.positive_int, default=4, help="threads per worker (default %(default)s)")
    p.add_argument(
        "--gpus",
        type=values.gpus,
        metavar="N|ID,ID...",
        help="the GPUs the workers share out, each its own: a count or a comma list of device ids (default: "
        "CORRAL_WORKER_GPUS, else those found on this machine)",
    )
    p.add_argument(
        "--memory-mb",
        type=values.worker_memory_mb,
        metavar="MB",
        help="memory in MiB each worker gives to jobs (default: CORRAL_WORKER_MEMORY_MB, else this machine's "
        "shared out among the workers)",
    )
    p.add_argument("--db", default="corral.db", help="SQLite database file (default %(default)s)")
    p.add_argument("--log-dir", type=Path, help="write the children's logs here instead of to this terminal")
    p.add_argument(
        "--ready-timeout", type=values.positive_seconds, default=30.0, help="seconds to wait for start-up (default 30)"
    )
    p.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV) or None,
        help=f"turn client auth on with this client token, which `corral up` uses too (default ${TOKEN_ENV})",
    )
    p.add_argument(
        "--worker-token",
        default=None,
        help="the token of the local workers (default $CORRAL_WORKER_TOKEN; with --token and none, a random one)",
    )
    p.add_argument("--log-level", choices=LEVELS, help="the children's log level (CORRAL_LOG_LEVEL, default info)")
    p.add_argument("--log-format", choices=FORMATS, help="the children's log lines (CORRAL_LOG_FORMAT, default json)")
    p.set_defaults(handler=up.up)


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        help="run a mix of the built-in job types and show the results",
        description="Submit a mix of the built-in job types (all but those that talk to a server: network_intensive, "
        "webhook, email), show them finish, print a results table. "
        "Without --control, starts an embedded Corral (2 workers x 2 threads) and stops it at the end.",
    )
    p.add_argument(
        "--control",
        type=values.addresses,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="use this control plane (or a list of one and its standbys) instead of an embedded one",
    )
    p.add_argument(
        "--token",
        type=values.token,
        default=os.environ.get(TOKEN_ENV) or None,
        metavar="TOKEN",
        help=f"with --control: the client token (default ${TOKEN_ENV}, else the token `corral login` saved for it)",
    )
    p.add_argument(
        "--tls-ca",
        type=values.readable_file,
        default=os.environ.get(TLS_CA_ENV) or None,
        metavar="FILE",
        help=f"with --control: speak TLS, verifying the control plane against this CA (default ${TLS_CA_ENV})",
    )
    p.add_argument("--jobs", type=values.positive_int, default=48, help="jobs to submit (default %(default)s)")
    p.add_argument(
        "--timeout", type=values.positive_seconds, default=120.0, help="give up after this many seconds (default 120)"
    )
    p.set_defaults(handler=demo.demo)


def _client_parent(*, token: bool = True, defaults: bool = True) -> argparse.ArgumentParser:
    """The options every client command takes; without ``token``, no ``--token`` (``corral login`` sends none).

    ``defaults=False`` leaves an option out of the result unless it is given: for the sub-commands of a
    command that takes the same options itself (``corral accounts [--json] delete NAME``), whose defaults
    would otherwise overwrite what was given before the sub-command.
    """

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--control",
        type=values.addresses,
        default=default(os.environ.get(CONTROL_ADDR_ENV) or DEFAULT_ADDRESS),
        metavar="HOST:PORT[,HOST:PORT...]",
        help="control plane gRPC address, or a comma-separated list of a control plane and its standbys, "
        f"tried in turn (default ${CONTROL_ADDR_ENV} or {DEFAULT_ADDRESS})",
    )
    if token:
        # The saved login is not a default here: reading it belongs to running a command, so a broken
        # file cannot break --help or a usage error (corral.cli.commands reads it as it builds the client).
        parent.add_argument(
            "--token",
            type=values.token,
            default=default(os.environ.get(TOKEN_ENV) or None),
            metavar="TOKEN",
            help=f"client token, sent as 'authorization: Bearer TOKEN' (default ${TOKEN_ENV}, else the token "
            "`corral login` saved, while it has not expired and only to the --control it was made with)",
        )
    parent.add_argument(
        "--tls-ca",
        type=values.readable_file,
        default=default(os.environ.get(TLS_CA_ENV) or None),
        metavar="FILE",
        help=f"speak TLS, verifying the control plane against this CA (default ${TLS_CA_ENV})",
    )
    parent.add_argument("--json", action="store_true", default=default(False), help="print JSON instead of a table")
    parent.add_argument(
        "--rpc-timeout",
        type=values.positive_seconds,
        default=default(30.0),
        metavar="SEC",
        help="deadline of each call (default 30)",
    )
    return parent


def _add_many_flags(p: argparse.ArgumentParser, what: str, limit_help: str) -> None:
    """The ids and filters of a command that changes one job or every one that matches (``cancel``,
    ``retry``)."""
    p.add_argument("ids", metavar="ID", nargs="*", help="job id(s)")
    p.add_argument("--type", default="", help="only jobs of this type")
    p.add_argument("--owner", default="", help="only jobs of this owner (a client token's name)")
    _add_label_filter(p)
    p.add_argument("--all", action="store_true", help=f"every {what} (needed when nothing else narrows it)")
    p.add_argument("--limit", type=values.positive_int32, default=0, help=limit_help)


def _add_error_code_filter(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--error-code",
        default="",
        metavar="CODE",
        help="only jobs whose latest attempt ended with this error, e.g. TIMEOUT",
    )


def _add_status_filter(p: argparse.ArgumentParser, help_text: str) -> None:
    p.add_argument("--status", type=values.job_state, action="append", default=[], metavar="S", help=help_text)


def _add_label_filter(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--label",
        type=values.label,
        action=_Pairs,
        default=[],
        metavar="K=V",
        help="only jobs with this label (repeatable: all of them), e.g. --label corral.notify=JOB_ID",
    )


def _add_client_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parent: argparse.ArgumentParser
) -> None:
    p = sub.add_parser("submit", parents=[parent], help="submit a job", description="Submit one job.")
    p.add_argument("type", help="job type, e.g. add_numbers")
    p.add_argument(
        "--payload",
        type=values.payload,
        default={},
        metavar="JSON|@FILE|@-",
        help="the job's input, a JSON object: given inline, as @FILE to read it from a file, or as @- to read "
        "it from stdin (default {})",
    )
    p.add_argument("--name", default="", help="a name to find the job by")
    p.add_argument("--priority", type=values.int32, default=0, help="0..100, higher runs first (default 0)")
    p.add_argument("--threads", type=values.int32, help="threads the job wants (default 1)")
    p.add_argument("--timeout", type=float, metavar="SEC", help="per-attempt deadline in seconds")
    p.add_argument("--max-attempts", type=values.int32, metavar="N", help="attempts before FAILED (default 3)")
    p.add_argument(
        "--at", type=values.when, metavar="TIME", help="start no earlier than: ISO 8601, or +30s / +5m / +1h"
    )
    p.add_argument("--idempotency-key", default="", metavar="KEY", help="resubmitting with it returns the same job")
    p.add_argument("--label", type=values.label, action=_Pairs, default=[], metavar="K=V", help="repeatable")
    p.add_argument(
        "--on",
        dest="worker_selector",
        type=values.label,
        action=_Pairs,
        default=[],
        metavar="K=V",
        help="run only on workers with this label (CORRAL_WORKER_LABELS), repeatable",
    )
    p.add_argument(
        "--after",
        dest="depends_on",
        action="append",
        default=[],
        metavar="JOB_ID",
        help="start only once this job SUCCEEDED (cancelled if it fails), repeatable",
    )
    p.add_argument(
        "--start-when",
        type=str.upper,
        choices=("ALL_SUCCEEDED", "ALL_ENDED"),
        default="ALL_SUCCEEDED",
        help="with --after: ALL_ENDED starts the job once those ended, however (to clean up or report)",
    )
    p.add_argument(
        "--gpus",
        dest="gpu_count",
        type=values.gpu_count,
        default=0,
        metavar="N",
        help="GPUs the job needs, 0..64: it runs only on a worker with that many free (default 0)",
    )
    p.add_argument(
        "--memory-mb",
        type=values.memory_mb,
        default=0,
        metavar="MB",
        help="memory the job needs, in MiB: it runs only on a worker with that much free (default 0: none)",
    )
    p.add_argument(
        "--notify",
        type=values.notify_target,
        action="append",
        default=[],
        metavar="EMAIL|URL",
        help="announce the job's end by email, or by a POST of the job to an http(s):// URL; repeatable",
    )
    p.add_argument(
        "--notify-on",
        type=values.end_state,
        action="append",
        default=[],
        metavar="STATE",
        help="announce only these ends: SUCCEEDED, FAILED, CANCELLED (repeatable; default: every end)",
    )
    p.add_argument("--wait", action="store_true", help="wait until the job finishes; exit 1 unless it SUCCEEDED")
    _add_follow_flag(p, "; exit 1 unless it SUCCEEDED")
    p.set_defaults(handler=commands.submit, check=_needs_notify(p))

    _add_submit_many(sub, parent)

    help_text = "wait until jobs end, on one stream however many (exit 1 unless all SUCCEEDED)"
    p = sub.add_parser("wait", parents=[parent], help=help_text, description=help_text[0].upper() + help_text[1:])
    p.add_argument("ids", nargs="+", metavar="ID", help="job ids")
    p.add_argument(
        "--timeout", type=values.positive_seconds, metavar="SEC", help="give up after this many seconds (exit 1)"
    )
    p.set_defaults(handler=commands.wait)

    for name, handler, help_text in (
        ("get", commands.get, "show one job"),
        ("watch", commands.watch, "print every change of a job until it finishes (exit 1 unless SUCCEEDED)"),
    ):
        p = sub.add_parser(name, parents=[parent], help=help_text, description=help_text[0].upper() + help_text[1:])
        p.add_argument("id", metavar="ID", help="job id")
        p.set_defaults(handler=handler)

    help_text = "cancel a job that has not finished, or every one that matches the filters"
    p = sub.add_parser(
        "cancel",
        parents=[parent],
        help=help_text,
        description="Cancel a job that has not finished (a running one is killed). With several ids or any "
        "filter, cancel every unfinished job that matches all of them, oldest first, 10,000 per call: "
        "`corral cancel --label batch=7`, `corral cancel --type resize_image --status PENDING`. "
        "--all is needed when nothing narrows it.",
    )
    _add_status_filter(p, "only jobs in this state: SCHEDULED, PENDING or RUNNING (repeatable)")
    _add_many_flags(p, "unfinished job", "at most this many in all (default: every one that matches)")
    p.set_defaults(handler=commands.cancel)

    help_text = "re-drive a FAILED job, or every one that matches the filters (the dead-letter queue)"
    p = sub.add_parser(
        "retry",
        parents=[parent],
        help=help_text,
        description="Re-drive a FAILED job with a fresh attempt budget. With several ids or any filter, "
        "re-drive every FAILED job that matches all of them, oldest first, 1,000 per call: "
        "`corral retry --error-code WORKER_LOST` after the outage that failed them. "
        "--all is needed when nothing narrows it.",
    )
    _add_many_flags(
        p,
        "FAILED job",
        "at most this many, oldest first (default: every one named; for a filter, 1,000 at most a run, as one"
        " call re-drives them: run it again for the rest)",
    )
    _add_error_code_filter(p)
    p.set_defaults(handler=commands.retry)

    help_text = "print what a job's latest attempt printed"
    p = sub.add_parser("output", parents=[parent], help=help_text, description=help_text[0].upper() + help_text[1:])
    p.add_argument("id", metavar="ID", help="job id")
    _add_follow_flag(p)
    p.set_defaults(handler=commands.output)

    p = sub.add_parser("list", parents=[parent], help="list jobs, newest first", description="List jobs, newest first.")
    _add_status_filter(p, "state(s), repeatable")
    _add_label_filter(p)
    _add_error_code_filter(p)
    _add_page_flags(p)
    p.set_defaults(handler=commands.list_jobs)

    p = sub.add_parser(
        "queue",
        parents=[parent],
        help="the PENDING jobs in the order workers will get them, with estimated starts",
        description="The PENDING jobs in the order workers will get them (priority, then the time each became "
        "ready), each with its place among all queued jobs and when it should start at the rate the queue "
        "drained over the last 15 minutes.",
    )
    _add_label_filter(p)
    _add_page_flags(p)
    p.set_defaults(handler=commands.queue)

    p = sub.add_parser("stats", parents=[parent], help="queue depth, workers, jobs by status, success rate")
    p.set_defaults(handler=commands.stats)
    p = sub.add_parser("workers", parents=[parent], help="list the registered workers")
    p.set_defaults(handler=commands.workers)
    p = sub.add_parser(
        "shares",
        parents=[parent],
        help="what each group or owner holds, queues and used, in fair-share order (admins)",
        description="Each share of the cluster (a group of CORRAL_GROUPS, or an owner in none): its jobs "
        "running and queued, the threads, GPUs and memory they hold, its dominant share now and lately, its "
        "rank (fair share serves the lowest first) and the thread- and GPU-hours its jobs used.",
    )
    p.set_defaults(handler=commands.shares)
    p = sub.add_parser("drain", parents=[parent], help="stop giving a worker jobs; it finishes them and leaves")
    p.add_argument("id", metavar="WORKER_ID", help="worker id (see `corral workers`)")
    p.set_defaults(handler=commands.drain)
    p = sub.add_parser(
        "audit",
        parents=[parent],
        help="the audit log: who cancelled, retried, drained, logged in or changed an account (admins)",
    )
    p.add_argument("--actor", default="", help="only events of this caller (a token's or account's name)")
    p.add_argument(
        "--action", default="", choices=("", *AUDIT_ACTIONS), metavar="ACTION", help=", ".join(AUDIT_ACTIONS)
    )
    p.add_argument("--target", default="", help="only events about this job, worker or account")
    p.add_argument("--outcome", default="", help="only events with this outcome: OK, PERMISSION_DENIED, ...")
    p.add_argument("--limit", type=values.positive_int32, default=100, help="1..1000 (default 100)")
    p.add_argument("--offset", type=values.int32, default=0, help="skip this many (default 0)")
    p.set_defaults(handler=commands.audit)


def _add_submit_many(sub: argparse._SubParsersAction[argparse.ArgumentParser], parent: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "submit-many",
        parents=[parent],
        help="submit a batch of jobs from a JSON file, all or none; later ones may start after earlier ones",
        description="Submit the jobs of a JSON file in one batch: all are accepted or none is. The file is the "
        'body of REST\'s POST /v1/jobs:batchSubmit, {"jobs": [...]}, or just the array. Each job is an object '
        "with the fields of corral.JobSpec, in snake_case or lowerCamelCase: type, payload, "
        "name, priority, thread_demand, timeout_sec, max_attempts, scheduled_at (ISO 8601, +30s, or Unix seconds), "
        "idempotency_key, labels, worker_selector, depends_on (job ids), gpu_count, memory_mb, and depends_on_index: "
        "earlier jobs of the file, by place (0 is the first), that must succeed before this one starts. "
        'Example: [{"type": "noop"}, {"type": "noop", "depends_on_index": [0]}]. '
        "The table shows each job's place (#) and, under after, the places (and ids) it waits for.",
    )
    p.add_argument("file", metavar="FILE", help="the JSON file, or - for stdin")
    p.add_argument("--wait", action="store_true", help="wait until every job ends; exit 1 unless all SUCCEEDED")
    p.set_defaults(handler=commands.submit_many)


def _add_account_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], parent: argparse.ArgumentParser
) -> None:
    """login, logout, whoami, register and accounts (list, passwd, delete): people with a name and a password."""
    stdin_help = "read the password from the first line of stdin instead of asking"
    p = sub.add_parser(
        "login",
        parents=[_client_parent(token=False)],
        help="log in to an account; the client commands then send its token to this --control until it expires",
        description="Log in to an account and save the login (its token, until it expires) for the client "
        f"commands to send to the same --control: to ${login_file.LOGIN_FILE_ENV}, else "
        "$XDG_CONFIG_HOME/corral/login, else ~/.config/corral/login. With --print, print the token instead "
        f"and save nothing: export {TOKEN_ENV}=$(corral login NAME --print --password-stdin <FILE).",
    )
    p.add_argument("name", metavar="NAME", help="the account")
    p.add_argument("--password-stdin", action="store_true", help=stdin_help)
    p.add_argument("--print", action="store_true", help="print the token on stdout instead of saving the login")
    p.set_defaults(handler=account_commands.login)

    p = sub.add_parser(
        "logout",
        help="forget the saved login",
        description="Remove the login `corral login` saved (the token stays valid until it expires).",
    )
    p.set_defaults(handler=account_commands.logout)

    p = sub.add_parser(
        "whoami",
        parents=[parent],
        help="who the control plane takes you for: name, admin, account, when the login expires",
    )
    p.set_defaults(handler=account_commands.whoami)

    p = sub.add_parser(
        "register",
        parents=[parent],
        help="create an account (CORRAL_ACCOUNTS=open: anyone; admin: admins only)",
        description="Create an account. The password is asked twice (8 to 72 bytes).",
    )
    p.add_argument("name", metavar="NAME", help="the new account's name: letters, digits and ._@- (up to 64)")
    p.add_argument("--password-stdin", action="store_true", help=stdin_help)
    p.set_defaults(handler=account_commands.register)

    p = sub.add_parser(
        "accounts",
        parents=[parent],
        help="list the accounts (admins); `accounts passwd` / `accounts delete NAME` change one; "
        "`accounts end-logins` ends them all",
        description="Without an ACTION, list the accounts (admins only); passwd [NAME] and delete NAME change one; "
        "end-logins ends every login of every account.",
    )
    p.set_defaults(handler=account_commands.list_accounts)
    actions = p.add_subparsers(dest="action", metavar="ACTION")  # none: list
    quiet = _client_parent(defaults=False)
    q = actions.add_parser("list", parents=[quiet], help="list the accounts (the default)")
    q.set_defaults(handler=account_commands.list_accounts)
    q = actions.add_parser(
        "passwd",
        parents=[quiet],
        help="change your password, or (admins) reset another account's",
        description="Change your own password (asks the current one, then the new one twice), or, as an admin, "
        "reset another account's (the new one only). Either way the account's earlier logins end.",
    )
    q.add_argument("name", metavar="NAME", nargs="?", help="the account (default: yours)")
    q.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the passwords from stdin instead of asking: for your own, the current one on the first "
        "line and the new one on the second; for another's, the new one on the first",
    )
    q.set_defaults(handler=account_commands.passwd)
    q = actions.add_parser(
        "delete",
        parents=[quiet],
        help="delete an account and end its logins (its jobs stay)",
        description="Delete an account and end its logins; its jobs stay. Admins, or the account itself.",
    )
    q.add_argument("name", metavar="NAME", help="the account")
    q.set_defaults(handler=account_commands.delete_account)
    q = actions.add_parser(
        "end-logins",
        parents=[quiet],
        help="end every login of every account at once (admins); passwords stay",
        description="End every login of every account at once, for when one may have leaked and it is not "
        "known whose. Passwords stay: people log in again. Admins only.",
    )
    q.set_defaults(handler=account_commands.end_logins)


def _needs_notify(p: argparse.ArgumentParser) -> Callable[[argparse.Namespace], None]:
    """The check of ``corral submit`` that no one argument shows alone: ``--notify-on`` needs ``--notify``."""

    def check(args: argparse.Namespace) -> None:
        if args.notify_on and not args.notify:
            p.error("argument --notify-on: says which ends to announce: give --notify too")  # exits 2

    return check


def _add_follow_flag(p: argparse.ArgumentParser, then: str = "") -> None:
    """``-f/--follow``: print what the job prints, as it prints it, until it ends (``then``: what the
    command does after, for the help)."""
    p.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help=f"print what the job prints, as it prints it, through retries, until it ends (notes on stderr){then}",
    )


def _add_page_flags(p: argparse.ArgumentParser) -> None:
    """The filters and paging of a command that lists jobs (``list``, ``queue``)."""
    p.add_argument("--type", default="", help="only jobs of this type")
    p.add_argument("--owner", default="", help="only jobs of this owner (a client token's name)")
    p.add_argument("--limit", type=values.positive_int32, default=50, help="1..1000 (default 50)")
    p.add_argument("--offset", type=values.int32, default=0, help="skip this many (default 0)")
