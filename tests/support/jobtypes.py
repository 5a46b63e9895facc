"""Job types for tests, registered with the runner's decorator (load with ``--import tests.support.jobtypes``).

* ``record`` {"path", "seconds"}: appends ``"<job_id> <attempt>\\n"`` to ``path`` (one O_APPEND write,
  so concurrent runners never interleave) then sleeps; fault tests count executions with it.
* ``ignore_sigterm_sleep`` {"seconds"}: ignores SIGTERM, then sleeps (only SIGKILL stops it).
* ``native_block`` {"seconds"}: blocks SIGTERM and sleeps inside libc (never back in the interpreter).
* ``py_loop`` {"n"}: ``for _ in range(n): pass``, the CPU-bound benchmark type.
* ``crash`` {"how": "exit" | "segv"}: the runner process dies (``os._exit(7)`` or SIGSEGV).
* ``big_output`` {"result_bytes", "error_bytes", "code"}: returns ``{"x": "a" * result_bytes}``, or with
  ``error_bytes`` fails with ``code`` (default ``BIG``) and a message of that many characters.

* ``chatty`` {"lines", "fail"?, "every"?, "hold"?}: prints ``lines`` numbered lines, "out N" to stdout
  and every tenth as "err N" to stderr, ``every`` seconds apart, then (with ``hold``, a path) waits
  until that file exists, then returns ``{"printed": lines}`` or, with ``fail``, fails ``CHATTY``.
* ``leak`` {"mib"}: keeps ``mib`` MiB alive in its runner process for good (a plug-in that leaks) and
  returns the runner's pid.
* ``markup[/v2]`` {}: succeeds at once; its name looks like Rich markup (a closing tag no tag opened),
  which the CLI must print as it is.

(``tests.support.probes`` has the ``pid_*`` variants that report their process id.)
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from typing import Any

from runner.errors import JobFailed
from runner.registry import JobContext, JobType, register

_SECONDS = {"type": "number", "minimum": 0, "maximum": 86400}


@register
class Record(JobType):
    """Append "<job_id> <attempt>" to a file, then sleep, or wait until the file ``hold`` exists (a test
    decides when the job ends, e.g. only once the control plane is down)."""

    name = "record"
    schema = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "minLength": 1},
            "seconds": _SECONDS,
            "hold": {"type": "string", "minLength": 1},
        },
        "required": ["path"],
        "additionalProperties": False,
    }

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Record this execution, then sleep ``seconds`` (default 0), or wait for ``hold`` (the job's
        timeout bounds that)."""
        fd = os.open(payload["path"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{ctx.job_id} {ctx.attempt}\n".encode())
        finally:
            os.close(fd)
        time.sleep(payload.get("seconds", 0))
        while "hold" in payload and not os.path.exists(payload["hold"]):
            time.sleep(0.01)
        return {"job_id": ctx.job_id, "attempt": ctx.attempt}


@register
class IgnoreSigtermSleep(JobType):
    """Ignore SIGTERM, then sleep."""

    name = "ignore_sigterm_sleep"
    schema = {
        "type": "object",
        "properties": {"seconds": _SECONDS},
        "required": ["seconds"],
        "additionalProperties": False,
    }

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Sleep ``seconds`` with SIGTERM ignored."""
        _ignore_sigterm_sleep(float(payload["seconds"]))
        return {}


@register
class NativeBlock(JobType):
    """Block SIGTERM and sleep in native code."""

    name = "native_block"
    schema = {
        "type": "object",
        "properties": {"seconds": _SECONDS},
        "required": ["seconds"],
        "additionalProperties": False,
    }

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Call libc ``sleep``/``usleep`` for ``seconds`` with SIGTERM blocked."""
        _native_block(float(payload["seconds"]))
        return {}


@register
class PyLoop(JobType):
    """Spin the interpreter n times (CPU-bound)."""

    name = "py_loop"
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 10_000_000_000}},
        "required": ["n"],
        "additionalProperties": False,
    }

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Run ``for _ in range(n): pass``."""
        for _ in range(int(payload["n"])):
            pass
        return {"n": int(payload["n"])}


@register
class Crash(JobType):
    """Kill the runner process itself."""

    name = "crash"
    schema = {
        "type": "object",
        "properties": {"how": {"enum": ["exit", "segv"]}},
        "additionalProperties": False,
    }

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Exit with status 7, or die of SIGSEGV."""
        if payload.get("how") == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
            time.sleep(10)
        os._exit(7)


@register
class BigOutput(JobType):
    """Return a large result, or fail with a large error."""

    name = "big_output"
    schema = {
        "type": "object",
        "properties": {
            "result_bytes": {"type": "integer", "minimum": 0},
            "error_bytes": {"type": "integer", "minimum": 0},
            "code": {"type": "string"},
        },
        "additionalProperties": False,
    }

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """See the module docstring."""
        if "error_bytes" in payload:
            raise JobFailed(payload.get("code", "BIG"), "é" + "m" * (payload["error_bytes"] - 1))
        return {"x": "a" * payload.get("result_bytes", 0)}


def _ignore_sigterm_sleep(seconds: float) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(seconds)


def _native_block(seconds: float) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    libc = ctypes.CDLL(None)
    libc.sleep(int(seconds))
    libc.usleep(int((seconds - int(seconds)) * 1_000_000))


_LEAKED: list[bytes] = []


@register
class Leak(JobType):
    """Keep ``mib`` MiB alive in this runner process for good; return the process id."""

    name = "leak"
    schema = {
        "type": "object",
        "properties": {"mib": {"type": "integer", "minimum": 0, "maximum": 1024}},
        "additionalProperties": False,
    }

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Hold the memory (written, so it is resident), then say which process ran."""
        mib = payload.get("mib", 0)
        if mib:
            _LEAKED.append(b"\x01" * (mib << 20))
        return {"pid": os.getpid()}


@register
class MarkupName(JobType):
    """Succeed at once; only the name matters (see the module docstring)."""

    name = "markup[/v2]"
    schema = {"type": "object", "additionalProperties": False}

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Nothing to do."""
        return {}


@register
class Chatty(JobType):
    """Print numbered lines to stdout and stderr, then succeed or fail."""

    name = "chatty"
    schema = {
        "type": "object",
        "properties": {
            "lines": {"type": "integer", "minimum": 0},
            "fail": {"type": "boolean"},
            "every": {"type": "number", "minimum": 0, "maximum": 10},
            "hold": {"type": "string"},
        },
        "required": ["lines"],
        "additionalProperties": False,
    }

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        lines = int(payload["lines"])
        every = float(payload.get("every", 0))
        for i in range(1, lines + 1):
            print(f"out {i}")
            if i % 10 == 0:
                print(f"err {i}", file=sys.stderr)
            if every:
                time.sleep(every)
        hold = payload.get("hold")
        while hold and not os.path.exists(hold):  # a test lets it end by creating the file
            time.sleep(0.01)
        if payload.get("fail"):
            raise JobFailed("CHATTY", f"failed after {lines} lines")
        return {"printed": lines}
