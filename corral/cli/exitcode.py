"""The exit statuses of the ``corral`` command, the one function that prints a failure, and what is left
to do when the reader of its output went away (``corral list | head``), which is no failure."""

from __future__ import annotations

import contextlib
import enum
import os
import sys
from typing import IO

__all__ = ["ExitCode", "discard_writes", "fail"]


class ExitCode(enum.IntEnum):
    """What ``corral``'s exit status means."""

    OK = 0
    """Done; for ``--wait`` and ``watch``, the job SUCCEEDED."""
    FAILED = 1
    """The server refused (for another reason than bad input: NOT_FOUND, FAILED_PRECONDITION, PERMISSION_DENIED
    ...) or failed the request, a waited-for job ended FAILED or CANCELLED, or a process died."""
    USAGE = 2
    """Bad input, whoever found it: a bad command line (argparse), e.g. a ``--payload`` that is not a JSON
    object or a ``--payload @FILE`` that cannot be read; a ``submit-many`` file that cannot be read or is not a
    batch of job objects; a value refused before anything is sent (``--payload '{"a": NaN}'``, a string
    where a job file needs a number) or by the control plane (INVALID_ARGUMENT: ``--priority 101``,
    ``--threads 0``, an unknown job type); a password typed twice differently. One error line names the
    argument or field and the rule."""
    UNREACHABLE = 3
    """The control plane could not be reached."""
    INTERRUPTED = 130
    """Stopped by Ctrl-C before finishing."""


def fail(message: str, code: ExitCode = ExitCode.FAILED) -> ExitCode:
    """Print ``corral: error: <message>`` as one line on stderr and return ``code``."""
    one_line = " ".join(message.split())
    print(f"corral: error: {one_line}", file=sys.stderr, flush=True)
    return code


def discard_writes(stream: IO[str]) -> None:
    """Send ``stream``'s later writes (Python's flush at exit among them) to the null device: its reader
    went away, and writing on would cost a traceback at exit."""
    with contextlib.suppress(OSError, ValueError):  # a stream with no descriptor: nothing to redirect
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)
