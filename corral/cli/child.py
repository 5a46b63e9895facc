"""One supervised child process, :class:`ChildProcess`: ``python -m MODULE ...`` with its log file."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

__all__ = ["ChildProcess"]

# The kernel's parent-death signal has to be asked for by the child itself. preexec_fn would do it between
# fork and exec, but would run Python there, in a forked copy of a supervisor that has gRPC's threads:
# gRPC's fork handlers, or a lock another thread held at the fork, can hang that copy before it execs,
# and the supervisor with it (it waits for the exec, and no signal reaches its main thread there). So a
# fresh interpreter asks for SIGTERM when the supervisor's thread goes, checks that the supervisor has
# not gone already, and replaces itself with the program: the request survives exec, and so does the pid.
_TETHER_SHIM = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)\n"  # 1: PR_SET_PDEATHSIG
    "except (OSError, AttributeError):\n"  # not Linux: Ctrl-C and SIGTERM still stop the children
    "    pass\n"
    "if os.getppid() != int(sys.argv[1]):\n"  # the supervisor died before the request took effect
    "    os.kill(os.getpid(), signal.SIGTERM)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


class ChildProcess:
    """One supervised ``python -m MODULE ...`` process and where its output goes."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str], log_path: Path | None) -> None:
        self.name = name
        self.argv = argv
        self.env = dict(env)
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self._log_offset = 0

    def start(self) -> None:
        """Start (or restart) the process in its own process group."""
        log: IO[bytes] | None = self.log_path.open("ab") if self.log_path else None
        self._log_offset = log.tell() if log else 0
        tethered = [sys.executable, "-I", "-S", "-c", _TETHER_SHIM, str(os.getpid()), *self.argv]
        try:
            # The supervisor starts its children from its main thread, which lives as long as it does:
            # the parent-death signal fires when the forking *thread* exits.
            self.process = subprocess.Popen(
                tethered,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                process_group=0,
            )
        finally:
            if log is not None:
                log.close()
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int:
        """The process id (0 before start)."""
        return self.process.pid if self.process else 0

    def exit_code(self) -> int | None:
        """The exit status once it exited (negative: killed by that signal), else ``None``."""
        return self.process.poll() if self.process else None

    def running(self) -> bool:
        """True while the process has been started and has not exited."""
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int) -> None:
        """Send ``signum`` if the process still runs."""
        if self.running():
            assert self.process is not None
            with contextlib.suppress(ProcessLookupError):  # it exited since running() looked
                self.process.send_signal(signum)

    def tail(self, lines: int = 10) -> str:
        """The last lines the latest run wrote to the log file ('' without one)."""
        if self.log_path is None:
            return ""
        try:
            with self.log_path.open("rb") as log:
                log.seek(max(self._log_offset, log.seek(0, 2) - 16384))
                text = log.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def describe_exit(self) -> str:
        """``exited with code N`` or ``was killed by SIGNAME``."""
        code = self.exit_code()
        if code is None:
            return "is running"
        if code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with code {code}"
