"""Job types that tell a test which process runs them (load with ``--import tests.support.probes``).

Each writes its process id to ``pid_path`` before it starts to wait, so that a test can watch that
very process die at a timeout or a cancel:

* ``pid_sleep``: sleeps in the interpreter (SIGTERM stops it);
* ``pid_ignore_sigterm``: ignores SIGTERM, then sleeps (only SIGKILL stops it);
* ``pid_native_block``: blocks SIGTERM and sleeps inside libc, never returning to the interpreter;
* ``pid_spawn``: starts a child process (``sleep``, as a job that runs a tool would) and writes the
  child's pid instead, then waits for it; with ``"detach": true`` it returns at once, leaving the
  child running.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from typing import Any

from runner.registry import JobContext, JobType, register

_SCHEMA = {
    "type": "object",
    "properties": {"pid_path": {"type": "string", "minLength": 1}, "seconds": {"type": "number", "minimum": 0}},
    "required": ["pid_path", "seconds"],
    "additionalProperties": False,
}


def _write_pid(path: str) -> None:
    _write_pid_of(path, os.getpid())


@register
class PidSleep(JobType):
    """Write the pid, then sleep."""

    name = "pid_sleep"
    schema = _SCHEMA

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        _write_pid(payload["pid_path"])
        time.sleep(payload["seconds"])
        return {}


@register
class PidIgnoreSigterm(JobType):
    """Write the pid, ignore SIGTERM, then sleep."""

    name = "pid_ignore_sigterm"
    schema = _SCHEMA

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _write_pid(payload["pid_path"])
        time.sleep(payload["seconds"])
        return {}


@register
class PidNativeBlock(JobType):
    """Write the pid, block SIGTERM, then sleep in libc."""

    name = "pid_native_block"
    schema = _SCHEMA

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        _write_pid(payload["pid_path"])
        ctypes.CDLL(None).sleep(int(payload["seconds"]))
        return {}


@register
class PidSpawn(JobType):
    """Start a child process, write its pid, then wait for it (or return at once with ``detach``)."""

    name = "pid_spawn"
    schema = {
        "type": "object",
        "properties": {**_SCHEMA["properties"], "detach": {"type": "boolean"}},  # type: ignore[dict-item]
        "required": ["pid_path", "seconds"],
        "additionalProperties": False,
    }

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        child = subprocess.Popen(["sleep", str(payload["seconds"])])
        _write_pid_of(payload["pid_path"], child.pid)
        if not payload.get("detach"):
            child.wait()
        return {"child": child.pid}


def _write_pid_of(path: str, pid: int) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(str(pid))
    os.replace(tmp, path)
