"""``command``: run a program with the job's cores and memory, as a research compute queue does.

It runs programs, so it is off unless a worker operator turns it on, and then only for the programs
they list::

    CORRAL_COMMAND_ALLOW=/opt/tools/align,python3 corral worker --import runner.extra.command

``CORRAL_COMMAND_ALLOW`` (the worker's environment) is a comma-separated list of executables, each
an absolute path or a bare name looked up on the worker's ``PATH`` when this module is imported, or
``*`` for any program. Unset or empty, the module refuses to import, so the worker exits 2 naming the
variable. A job's ``argv[0]`` is looked up on the worker's ``PATH`` (or, holding a ``/``, taken
relative to the job's ``cwd``) and its real path (symlinks and ``..`` resolved) must be one of the
listed programs' real paths; that file is what runs. An allowed shell or interpreter runs anything.

Payload (:data:`SCHEMA`)::

    argv              [str, ...]   1..256 non-empty strings without NUL; no shell
    env?              {str: str}   merged over PATH, HOME, LANG, TMPDIR (from the worker) and the
                                   thread variables; names starting with ``LD_`` are refused
    cwd?              str          an existing directory
    stdin?            str          up to 1 MiB characters (default: /dev/null)
    memory_mb?        int >= 1     the program's address-space limit (RLIMIT_AS), in MiB
    max_output_bytes? 1..4 MiB     how much of the end of stdout, and of stderr, is kept (64 KiB)

The job's granted threads (``thread_demand``) reach the program as ``CORRAL_THREADS``,
``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` and ``MKL_NUM_THREADS``. Its GPUs reach it as
``CUDA_VISIBLE_DEVICES``, the runner's own while the job runs (:mod:`runner.serve` sets it to the
devices the worker gave the job, empty for none, on a worker that has GPUs); the payload's ``env``
cannot change it, so a program does not take another job's GPU.

Result on exit status 0: ``{"exit_code": 0, "stdout", "stderr", "stdout_bytes", "stderr_bytes",
"truncated", "seconds"}`` (the kept ends, decoded as UTF-8 with replacement; the byte counts are
totals). Failures: ``COMMAND_FAILED`` (``exit status N`` and the end of stderr), ``COMMAND_KILLED``
(the signal's name), ``COMMAND_NOT_ALLOWED`` (the program's real path), ``COMMAND_NOT_FOUND``
(``argv[0]`` or ``cwd``).

The program stays in its runner's process group, so the worker's timeout and cancel (which signal
that group) and a killed worker (:mod:`runner._lifeline`) stop it with the job.
"""

from __future__ import annotations

import os
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runner.errors import JobFailed
from runner.payload import as_int
from runner.registry import JobContext, JobType, register
from runner.serve import adopt_orphans
from runner.wire import DEVICES_ENV

__all__ = [
    "ALLOW_ENV",
    "SCHEMA",
    "THREAD_VARIABLES",
    "Allowlist",
    "Command",
    "OutputTail",
    "allowlist_from_env",
]

ALLOW_ENV = "CORRAL_COMMAND_ALLOW"
"""The worker's environment variable listing the programs command jobs may run."""
DEFAULT_MAX_OUTPUT = 64 << 10
"""Bytes kept from the end of stdout, and of stderr, when the payload does not say."""
MAX_OUTPUT = 4 << 20
"""The largest ``max_output_bytes``."""
THREAD_VARIABLES = ("CORRAL_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
"""Environment variables that carry the job's granted threads to the program."""
PASSED_THROUGH = ("PATH", "HOME", "LANG", "TMPDIR")
"""The worker's environment variables a program gets; nothing else of the worker's leaks to it (but
``CUDA_VISIBLE_DEVICES``, the job's GPUs, see :func:`program_env`)."""

_NO_NUL = r"^[^\x00]*$"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "argv": {
            "type": "array",
            "minItems": 1,
            "maxItems": 256,
            # 128 KiB: the kernel's limit on one argument string (MAX_ARG_STRLEN)
            "items": {"type": "string", "minLength": 1, "maxLength": 131072, "pattern": _NO_NUL},
        },
        "env": {
            "type": "object",
            "maxProperties": 256,
            # LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT ... would load a job's own code into an allowed program.
            # "Not LD_, then no = or NUL", without lookahead: payload patterns run on RE2 (corral.payload_schema)
            "propertyNames": {
                "pattern": r"^(?:[^L=\x00]|L(?:$|[^D=\x00])|LD(?:$|[^_=\x00]))[^=\x00]*$",
                "maxLength": 256,
            },
            "additionalProperties": {"type": "string", "maxLength": 131072, "pattern": _NO_NUL},
        },
        "cwd": {"type": "string", "minLength": 1, "maxLength": 4096, "pattern": _NO_NUL},
        "stdin": {"type": "string", "maxLength": 1 << 20},
        # The top keeps memory_mb << 20 within what setrlimit takes.
        "memory_mb": {"type": "integer", "minimum": 1, "maximum": 1 << 30},
        "max_output_bytes": {"type": "integer", "minimum": 1, "maximum": MAX_OUTPUT},
    },
    "required": ["argv"],
    "additionalProperties": False,
}
"""The payload's JSON Schema, which the worker advertises and the control plane validates against."""

_READ_SIZE = 64 << 10
_EXIT_DRAIN_SEC = 1.0
"""How long output is still read after the program exits: a process it left in the background may hold
its pipes open, and must not hold the job until its timeout."""
_FAILURE_TAIL_CHARS = 1000
_FAILURE_TAIL_LINES = 3

# The memory limit must be in place before the program's first instruction, so it is set between fork
# and exec. preexec_fn would run Python in the forked child of a runner that has threads (the compiled
# kernels' pool), where a lock another thread held at the fork can deadlock it; prlimit(1) comes with
# util-linux, which slim images lack. So a fresh interpreter (always at hand: the one running us) sets
# the limit and replaces itself with the program; exec keeps the limit and the process (and group).
_RLIMIT_SHIM = (
    "import os, resource, sys\n"
    "resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_AS)[1]))\n"
    "try:\n"
    "    os.execv(sys.argv[2], sys.argv[3:])\n"
    "except OSError as exc:\n"
    "    sys.stderr.write(f'{sys.argv[3]}: {exc.strerror}\\n')\n"
    "    sys.exit(127)\n"
)


@dataclass(frozen=True, slots=True)
class Allowlist:
    """The programs command jobs may run: real paths, or any program."""

    paths: frozenset[str]
    """Real paths (symlinks resolved) of the allowed executables."""
    any_program: bool = False
    """``*`` was listed: every program is allowed."""

    @classmethod
    def parse(cls, text: str, search_path: str | None = None) -> Allowlist:
        """The list in ``text`` (``CORRAL_COMMAND_ALLOW`` syntax), names looked up on ``search_path``.

        Raises:
            ValueError: the list is empty, or an entry is relative or names no executable file.
        """
        entries = [entry.strip() for entry in text.split(",") if entry.strip()]
        if not entries:
            raise ValueError("the list is empty")
        paths: set[str] = set()
        for entry in entries:
            if entry == "*":
                continue
            if "/" in entry and not os.path.isabs(entry):
                raise ValueError(f"{entry!r} is neither an absolute path nor a bare name")
            found = shutil.which(entry, path=search_path)
            if found is None:
                raise ValueError(f"{entry!r} is not an executable file" + ("" if "/" in entry else " on PATH"))
            paths.add(os.path.realpath(found))
        return cls(frozenset(paths), any_program="*" in entries)

    def permits(self, real_path: str) -> bool:
        """Whether the executable at ``real_path`` (already resolved) may run."""
        return self.any_program or real_path in self.paths


def allowlist_from_env(environ: Mapping[str, str] | None = None) -> Allowlist:
    """The allow list from ``CORRAL_COMMAND_ALLOW``, names looked up on the same environment's PATH.

    Raises:
        ImportError: the variable is unset, empty or wrong (the message names it); raised while the
            module is imported, it stops the worker with exit status 2.
    """
    env = os.environ if environ is None else environ
    try:
        return Allowlist.parse(env.get(ALLOW_ENV, ""), env.get("PATH"))
    except ValueError as exc:
        raise ImportError(
            f"{ALLOW_ENV} must list the programs command jobs may run (comma-separated absolute paths or "
            f"names on PATH, or * for any): {exc}"
        ) from None


class OutputTail:
    """The last ``limit`` bytes of a stream, and how many bytes it carried in all."""

    def __init__(self, limit: int) -> None:
        """Keep at most ``limit`` bytes (the buffer holds up to twice that between trims)."""
        self.limit = limit
        self.total = 0
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        """Count ``data`` and keep its end."""
        self.total += len(data)
        self._buffer += data
        # Trimming only past twice the limit keeps the copying linear in the output's size.
        if len(self._buffer) > 2 * self.limit:
            del self._buffer[: len(self._buffer) - self.limit]

    @property
    def truncated(self) -> bool:
        """Whether bytes were dropped from the start."""
        return self.total > self.limit

    def text(self) -> str:
        """The kept end, decoded as UTF-8 with replacement; a character cut at its start is dropped."""
        kept = bytes(self._buffer[-self.limit :]) if self._buffer else b""
        if self.truncated:
            skip = 0
            while skip < min(3, len(kept)) and 0x80 <= kept[skip] < 0xC0:  # continuation bytes
                skip += 1
            kept = kept[skip:]
        return kept.decode("utf-8", errors="replace")


def program_env(extra: Mapping[str, str], threads: int, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The program's environment: the worker's PATH, HOME, LANG and TMPDIR, the thread variables, then
    the payload's ``env`` over them, then the runner's ``CUDA_VISIBLE_DEVICES`` (the job's GPUs) if it
    has one: the same devices a Python job sees, and no others."""
    source = os.environ if environ is None else environ
    env = {name: source[name] for name in PASSED_THROUGH if name in source}
    env.update(dict.fromkeys(THREAD_VARIABLES, str(threads)))
    env.update(extra)
    devices = source.get(DEVICES_ENV)
    if devices is not None:
        env[DEVICES_ENV] = devices
    return env


def _resolve(program: str, cwd: str | None) -> str:
    """The real path of the executable ``argv[0]`` names, looked up as the worker would run it.

    Raises:
        JobFailed: ``COMMAND_NOT_FOUND`` naming ``program``.
    """
    # The worker's PATH, not the payload's env: a job must not choose where a bare name is found.
    candidate = os.path.join(cwd or os.getcwd(), program) if "/" in program else program
    found = shutil.which(candidate)
    if found is None:
        where = "is not an executable file" if "/" in program else "is not an executable on the worker's PATH"
        raise JobFailed("COMMAND_NOT_FOUND", f"argv[0]: {program!r} {where}")
    return os.path.realpath(found)


def _address_space_limit(memory_mb: int) -> int:
    """``memory_mb`` in bytes, never above a limit the runner already has (the operator's)."""
    wanted = memory_mb << 20
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return wanted if soft == resource.RLIM_INFINITY else min(wanted, soft)


def _start(
    real: str, argv: list[str], env: dict[str, str], cwd: str | None, memory_mb: int | None, stdin: bool
) -> subprocess.Popen[bytes]:
    """Start the program: no shell, fds closed, in this process group (never a session of its own)."""
    if memory_mb is None:
        args, executable = argv, real
    else:
        limit = _address_space_limit(memory_mb)
        args, executable = [sys.executable, "-I", "-S", "-c", _RLIMIT_SHIM, str(limit), real, *argv], sys.executable
    try:
        return subprocess.Popen(
            args,
            executable=executable,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
            close_fds=True,
        )
    except OSError as exc:  # checked just before, but the file or the directory can change under us
        raise JobFailed("COMMAND_NOT_FOUND", f"argv[0]: {argv[0]!r}: {exc.strerror or exc}") from None


class _Pump:
    """Feeds a program's stdin and reads its stdout and stderr at the same time, keeping only their
    tails, so that a program blocked on a full pipe never blocks us, nor we it."""

    def __init__(self, proc: subprocess.Popen[bytes], stdin: bytes | None, out: OutputTail, err: OutputTail) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        self._proc = proc
        self._selector = selectors.DefaultSelector()
        self._tails = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
        for fd in self._tails:
            self._selector.register(fd, selectors.EVENT_READ)
        self._pending = memoryview(stdin or b"")
        if proc.stdin is not None and self._pending:
            os.set_blocking(proc.stdin.fileno(), False)
            self._selector.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
        elif proc.stdin is not None:
            proc.stdin.close()  # an empty stdin: end of file at once
        try:
            self._exit_fd: int | None = os.pidfd_open(proc.pid)
            self._selector.register(self._exit_fd, selectors.EVENT_READ)
        except OSError:  # no pidfd (an old kernel): the output is read to its end instead
            self._exit_fd = None
        self._stop_at: float | None = None

    def run(self) -> None:
        """Pump until stdout and stderr end, or :data:`_EXIT_DRAIN_SEC` after the program exits."""
        try:
            while self._tails and (self._stop_at is None or time.monotonic() < self._stop_at):
                timeout = None if self._stop_at is None else max(0.0, self._stop_at - time.monotonic())
                for key, _ in self._selector.select(timeout):
                    if key.fd == self._exit_fd:
                        self._selector.unregister(key.fd)
                        self._stop_at = time.monotonic() + _EXIT_DRAIN_SEC
                    elif key.fd in self._tails:
                        self._read(key.fd)
                    else:
                        self._write(key.fd)
        finally:
            self._close()

    def _read(self, fd: int) -> None:
        data = os.read(fd, _READ_SIZE)
        if data:
            self._tails[fd].feed(data)
        else:
            self._selector.unregister(fd)
            del self._tails[fd]

    def _write(self, fd: int) -> None:
        try:
            self._pending = self._pending[os.write(fd, self._pending[:_READ_SIZE]) :]
        except BlockingIOError:
            return
        except BrokenPipeError:  # the program does not read all its input: its choice, not a failure
            self._pending = self._pending[:0]
        if not self._pending:
            self._selector.unregister(fd)
            assert self._proc.stdin is not None
            self._proc.stdin.close()

    def _close(self) -> None:
        self._selector.close()
        if self._exit_fd is not None:
            os.close(self._exit_fd)
        for stream in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()


def _stderr_end(err: OutputTail) -> str:
    """The last few non-empty lines of stderr, short enough for an error message."""
    lines = [line for line in err.text().splitlines() if line.strip()]
    return "\n".join(lines[-_FAILURE_TAIL_LINES:])[-_FAILURE_TAIL_CHARS:]


def _failure(returncode: int, err: OutputTail) -> JobFailed:
    end = _stderr_end(err)
    suffix = f": {end}" if end else ""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return JobFailed("COMMAND_KILLED", f"killed by {name}{suffix}")
    return JobFailed("COMMAND_FAILED", f"exit status {returncode}{suffix}")


# Read at import, before the type registers: a worker without the list refuses to start (exit status 2).
ALLOWLIST = allowlist_from_env()
"""The programs the registered type allows, read from ``CORRAL_COMMAND_ALLOW`` at import."""


@register
class Command(JobType):
    """Run an allowed program (no shell) with the job's threads and an optional memory limit."""

    name = "command"
    schema = SCHEMA

    def __init__(self, allowlist: Allowlist | None = None) -> None:
        """Use ``allowlist``, or the one read from ``CORRAL_COMMAND_ALLOW`` at import (the registered one)."""
        self.allowlist = ALLOWLIST if allowlist is None else allowlist

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """Check the program against the allow list, run it, and report its exit and output tails."""
        argv = [str(arg) for arg in payload["argv"]]
        cwd = payload.get("cwd")
        if cwd is not None and not os.path.isdir(cwd):
            raise JobFailed("COMMAND_NOT_FOUND", f"cwd: {cwd!r} is not an existing directory")
        real = _resolve(argv[0], cwd)
        if not self.allowlist.permits(real):
            raise JobFailed("COMMAND_NOT_ALLOWED", f"argv[0]: {argv[0]!r} is {real}, which {ALLOW_ENV} does not list")
        limit = as_int(payload.get("max_output_bytes", DEFAULT_MAX_OUTPUT), "max_output_bytes")
        memory_mb = as_int(payload["memory_mb"], "memory_mb") if "memory_mb" in payload else None
        stdin = payload["stdin"].encode() if "stdin" in payload else None
        env = program_env(payload.get("env") or {}, ctx.threads)
        out, err = OutputTail(limit), OutputTail(limit)
        adopt_orphans()  # a runner did as it started; this covers any other host of the type
        started = time.monotonic()
        proc = _start(real, argv, env, cwd, memory_mb, stdin is not None)
        try:
            _Pump(proc, stdin, out, err).run()
            returncode = proc.wait()
        finally:
            if proc.returncode is None:  # interrupted here (not by the worker, which ends us both): no orphan
                proc.kill()
                proc.wait()
        seconds = time.monotonic() - started
        if returncode != 0:
            raise _failure(returncode, err)
        return {
            "exit_code": 0,
            "stdout": out.text(),
            "stderr": err.text(),
            "stdout_bytes": out.total,
            "stderr_bytes": err.total,
            "truncated": out.truncated or err.truncated,
            "seconds": round(seconds, 6),
        }
