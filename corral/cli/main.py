"""The ``corral`` entry point: parse the command line, run the handler, turn failures into exit statuses."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from corral.cli import config_check
from corral.cli.exitcode import ExitCode, fail
from corral.cli.parser import PASSTHROUGH, build_parser
from corral.errors import CorralError, InvalidArgument, Unavailable
from corral.failover import UNREACHED_PREFIX

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``corral`` with ``argv`` (default ``sys.argv[1:]``) and return its exit status.

    ``corral control ...`` and ``corral worker ...`` replace this process with ``python -m control ...`` /
    ``python -m worker ...`` and do not return; so does ``corral config`` (``python -m control --check-config``).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in PASSTHROUGH:
        os.execv(sys.executable, [sys.executable, "-m", PASSTHROUGH[args[0]], *args[1:]])
    if args and args[0] == "config":
        return config_check.main(args[1:])
    parser = build_parser()
    parsed = parser.parse_args(args)
    check = getattr(parsed, "check", None)
    if check is not None:
        check(parsed)
    try:
        return int(parsed.handler(parsed))
    except Unavailable as exc:
        # "cannot reach ...": the client named the address(es) itself (a deadline before any contact)
        if exc.answered or exc.message.startswith(UNREACHED_PREFIX):
            return fail(f"UNAVAILABLE: {exc.message}{_notes(exc)}", ExitCode.UNREACHABLE)
        address = getattr(parsed, "control", None) or "the control plane"
        return fail(
            f"UNAVAILABLE: cannot reach the control plane at {address}: {exc.message}{_notes(exc)}",
            ExitCode.UNREACHABLE,
        )
    except InvalidArgument as exc:  # bad input, whoever found it (a job file, the client, the control plane)
        return fail(_invalid(exc), ExitCode.USAGE)
    except CorralError as exc:
        return fail(f"{exc.code}: {exc.message}{_notes(exc)}")
    except KeyboardInterrupt as exc:
        return fail(f"interrupted{_notes(exc)}", ExitCode.INTERRUPTED)
    except BrokenPipeError:  # `corral list | head`: the reader left; nothing more to say
        sys.stderr.close()
        return ExitCode.OK


def _notes(exc: BaseException) -> str:
    """What a handler added to ``exc`` (``add_note``: a job that was accepted and goes on), after a ``;``."""
    return "".join(f"; {note}" for note in getattr(exc, "__notes__", ()))


def _invalid(exc: InvalidArgument) -> str:
    where = f"field {exc.field!r}: " if exc.field else ""
    return f"INVALID_ARGUMENT: {where}{exc.rule}{_notes(exc)}"
