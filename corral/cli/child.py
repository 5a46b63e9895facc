"""One supervised child process, :class:`ChildProcess`: ``python -m MODULE ...`` with its log file."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

__all__ = ["ChildProcess"]

_PR_SET_PDEATHSIG = 1


def _stop_with(parent: int) -> None:
    """In the child, before exec: have the kernel send SIGTERM when the supervisor dies, even by
    SIGKILL, so the control plane and workers shut down (drain) instead of running on unsupervised."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: Ctrl-C and SIGTERM still stop them
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the supervisor died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


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
        parent = os.getpid()
        try:
            # The supervisor starts its children from its main thread, which lives as long as it does:
            # the parent-death signal fires when the forking *thread* exits.
            self.process = subprocess.Popen(
                self.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                process_group=0,
                preexec_fn=lambda: _stop_with(parent),
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
