"""The account commands of ``corral``: login, logout, whoami, register, accounts (list, passwd, delete).

Passwords are asked at the terminal without echo (a new one twice), or read from stdin with
``--password-stdin``, one per line. ``corral login`` saves the login (:mod:`corral.cli.login_file`),
which the client commands then send to the control plane it was made with (see
:mod:`corral.cli.commands`). Errors are not caught here, as for the other commands.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import UTC, datetime
from getpass import getpass

from corral.cli import login_file, render
from corral.cli.commands import client_for
from corral.cli.exitcode import ExitCode, fail
from corral.cli.login_file import LoginFileError, SavedLogin
from corral.client import Client

__all__ = ["delete_account", "end_logins", "list_accounts", "login", "logout", "passwd", "register", "whoami"]


class _BadInput(Exception):
    """Passwords that cannot be sent (two that differ, stdin that ended early): bad input (exit 2); the message
    is the error line."""


def login(args: argparse.Namespace) -> int:
    """``corral login NAME``: log in and save the login for the client commands (``--print``: print the token
    and save nothing)."""
    try:
        password = _stdin_lines(1)[0] if args.password_stdin else _ask("Password: ")
    except _BadInput as exc:
        return fail(str(exc), ExitCode.USAGE)
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
    try:
        saved_to = login_file.save(SavedLogin(args.control, name, value.token, value.expires_at))
    except LoginFileError as exc:  # the control plane made the login: say so, with why it is not kept
        return fail(f"logged in as {name}, but {exc.message}")
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
    with client_for(args) as client:
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
        return fail(str(exc), ExitCode.USAGE)
    with client_for(args) as client:
        account = client.register(args.name, password)
    if args.json:
        render.print_json(account.to_dict())
    else:
        render.console().print(f"Registered account [bold]{account.name}[/]")
    return ExitCode.OK


def list_accounts(args: argparse.Namespace) -> int:
    """``corral accounts``: every account (admins only)."""
    with client_for(args) as client:
        found = client.accounts()
    if args.json:
        render.print_json([a.to_dict() for a in found])
    else:
        render.console().print(render.accounts_table(found))
    return ExitCode.OK


def passwd(args: argparse.Namespace) -> int:
    """``corral accounts passwd [NAME]``: change one's own password (the current one, then the new one), or
    reset another account's as an admin (the new one only). NAME defaults to the caller's own account."""
    with client_for(args) as client:
        # WhoAmI says whether NAME is the caller's own account, which needs the current password too
        identity = client.whoami()
        own = identity.account.name if identity.account is not None else None
        name = args.name or own
        if name is None:
            return fail(
                "you are not logged in to an account here (corral login NAME), so name the one whose password "
                "to reset: corral accounts passwd NAME",
                ExitCode.USAGE,
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
            return fail(str(exc), ExitCode.USAGE)
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


def end_logins(args: argparse.Namespace) -> int:
    """``corral accounts end-logins``: end every login of every account (admins only)."""
    with client_for(args) as client:
        client.end_all_logins()
    if args.json:
        render.print_json({"ended": True})
    else:
        render.console().print("Ended every login: everyone logs in again (passwords are unchanged)")
    return ExitCode.OK


def delete_account(args: argparse.Namespace) -> int:
    """``corral accounts delete NAME``: delete an account and end its logins (its jobs stay)."""
    with client_for(args) as client:
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
