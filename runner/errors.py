"""How a job fails, and the exit codes of ``python -m runner``.

A job reports a failure by raising :class:`JobFailed` with a code; any other exception a job raises
is reported as ``ERROR``. The codes a runner produces itself::

    ERROR            the job raised (JobFailed("ERROR", ...) or any other exception)
    INVALID_PAYLOAD  the payload is not JSON or breaks the type's schema
    UNKNOWN_TYPE     no job type has the requested name
    MEMORY_LIMIT     the job ran out of memory (its runner's CORRAL_JOB_MEMORY_LIMIT_MB); the
                     runner process exits after reporting it and the worker starts a fresh one
    RESULT_TOO_LARGE the result is over corral.limits.MAX_RESULT_BYTES of JSON

Built-in job types add their own (``OVERFLOW``, ``HTTP_ERROR``, ``NETWORK_ERROR``, ``TOO_LARGE``,
``SMTP_ERROR``, ``SMTP_NOT_CONFIGURED``, ``IO_ERROR``, ``IO_MISMATCH``; see runner/README.md).

A worker adds ``TIMEOUT``, ``CANCELLED``, ``HANDED_BACK`` and ``CRASHED`` (a runner process that died).
"""

from __future__ import annotations

__all__ = [
    "EXIT_FAILED",
    "EXIT_INVALID_PAYLOAD",
    "EXIT_OK",
    "EXIT_UNKNOWN_TYPE",
    "EXIT_USAGE",
    "JobFailed",
    "as_text",
    "exit_code_for",
]

EXIT_OK = 0
"""The job succeeded; its result is on stdout."""
EXIT_FAILED = 1
"""The job failed (code ERROR or a job-specific code); the error is on stderr."""
EXIT_USAGE = 2
"""Bad command line (argparse's own code)."""
EXIT_INVALID_PAYLOAD = 3
"""The payload is not a JSON object or breaks the type's schema."""
EXIT_UNKNOWN_TYPE = 4
"""No job type has the requested name."""

_EXIT_BY_CODE = {"INVALID_PAYLOAD": EXIT_INVALID_PAYLOAD, "UNKNOWN_TYPE": EXIT_UNKNOWN_TYPE}


class JobFailed(Exception):
    """Raised by a job (or the runner) for a failure it reports: a code and a message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def exit_code_for(code: str) -> int:
    """The exit code of ``python -m runner`` for a failure with this error code."""
    return _EXIT_BY_CODE.get(code, EXIT_FAILED)


def as_text(value: object) -> str:
    """``value`` as text for a failure's code or message: a job may set them to anything (an int, an
    object whose ``__str__`` raises), and its runner must still answer, not die writing the answer."""
    if isinstance(value, str):
        return value
    try:
        return str(value)
    except Exception:  # anything its __str__ raises
        return f"<{type(value).__name__} that cannot be shown>"
