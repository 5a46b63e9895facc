"""The exit statuses of the ``corral`` command, and the one function that prints a failure."""

from __future__ import annotations

import enum
import sys

__all__ = ["ExitCode", "fail"]


class ExitCode(enum.IntEnum):
    """What ``corral``'s exit status means."""

    OK = 0
    """Done; for ``--wait`` and ``watch``, the job SUCCEEDED."""
    FAILED = 1
    """The server refused or failed the request, a waited-for job ended FAILED or CANCELLED, or a process died."""
    USAGE = 2
    """Bad command line (argparse), e.g. a ``--payload`` that is not a JSON object."""
    UNREACHABLE = 3
    """The control plane could not be reached."""
    INTERRUPTED = 130
    """Stopped by Ctrl-C before finishing."""


def fail(message: str, code: ExitCode = ExitCode.FAILED) -> ExitCode:
    """Print ``corral: error: <message>`` as one line on stderr and return ``code``."""
    one_line = " ".join(message.split())
    print(f"corral: error: {one_line}", file=sys.stderr, flush=True)
    return code
