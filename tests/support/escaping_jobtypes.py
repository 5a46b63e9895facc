"""Job types whose processes leave the runner's process group, and one that fights its memory limit
(load with ``--import tests.support.escaping_jobtypes``).

* ``escape`` {"pid_path": str, "seconds"?: number}: starts two processes that leave the runner's
  process group for sessions of their own, as daemons do:

  - ``sleep 300`` started with ``start_new_session=True`` (``setsid sleep``), a child of the runner;
  - a daemon, by the classic double fork: a child that calls ``setsid()``, forks ``sleep 300`` and
    exits, so that the sleep is orphaned (the runner, which adopts orphans, becomes its parent);

  writes ``{"runner", "setsid", "daemon"}`` (pids) and ``"groups"``, the process group and session of
  each of the two as they ran (``[[pgid, sid], [pgid, sid]]``), to ``pid_path`` once both run, then sleeps
  ``seconds`` (default 0: returns at once) and returns the same.
* ``raise_memory_limit`` {"mib": int}: raises its soft ``RLIMIT_AS`` as far as it can (to the hard
  limit), then allocates ``mib`` MiB; returns ``{"soft", "hard"}`` as they were after the raise.
* ``lower_memory_hard_limit`` {}: lowers the hard ``RLIMIT_AS`` (and with it the soft one) by 1 MiB,
  which no unprivileged process can raise again; returns ``{"pid": the runner's pid}``.
* ``memory_limits`` {}: returns ``{"pid", "soft", "hard"}``, its runner's ``RLIMIT_AS`` (-1: none).
* ``spawn_python`` {}: runs ``python -c 'print(6 * 7)'`` and returns ``{"printed": its output, "pid"}``:
  a job's subprocess under the runner's limits.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

from runner.registry import JobContext, JobType, register

_DAEMON = (
    "import os, sys\n"
    "os.setsid()\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    null = os.open(os.devnull, os.O_RDWR)\n"
    "    for fd in (0, 1, 2):\n"
    "        os.dup2(null, fd)\n"
    "    os.execvp('sleep', ['sleep', '300'])\n"
    "print(pid, flush=True)\n"
    "os._exit(0)\n"
)
"""The middle process of the double fork: a session of its own, a child in it, and gone."""


def _write_json(path: str, value: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


@register
class Escape(JobType):
    """Start a ``setsid`` sleep and a double-forked daemon; see the module docstring."""

    name = "escape"
    schema = {
        "type": "object",
        "properties": {"pid_path": {"type": "string", "minLength": 1}, "seconds": {"type": "number", "minimum": 0}},
        "required": ["pid_path"],
        "additionalProperties": False,
    }

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """See the module docstring."""
        quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        alone = subprocess.Popen(["sleep", "300"], start_new_session=True, **quiet)  # type: ignore[call-overload]
        middle = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _DAEMON], capture_output=True, text=True, check=True, timeout=30
        )
        daemon = int(middle.stdout)
        groups = [[os.getpgid(pid), os.getsid(pid)] for pid in (alone.pid, daemon)]
        pids = {"runner": os.getpid(), "setsid": alone.pid, "daemon": daemon, "groups": groups}
        _write_json(payload["pid_path"], pids)
        time.sleep(float(payload.get("seconds", 0)))
        return pids


@register
class RaiseMemoryLimit(JobType):
    """Raise the soft address-space limit to the hard one, then allocate; see the module docstring."""

    name = "raise_memory_limit"
    schema = {
        "type": "object",
        "properties": {"mib": {"type": "integer", "minimum": 1}},
        "required": ["mib"],
        "additionalProperties": False,
    }

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """See the module docstring."""
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        block = bytearray(payload["mib"] << 20)
        block[-1] = 1  # touched, so that it is not optimised away
        return {"soft": soft, "hard": hard}


@register
class LowerMemoryHardLimit(JobType):
    """Lower the hard address-space limit for good; see the module docstring."""

    name = "lower_memory_hard_limit"
    schema = {"type": "object", "additionalProperties": False}

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """See the module docstring."""
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        lower = (hard if hard != resource.RLIM_INFINITY else 1 << 46) - (1 << 20)
        resource.setrlimit(resource.RLIMIT_AS, (lower, lower))
        return {"pid": os.getpid()}


@register
class SpawnPython(JobType):
    """Run a small Python program; see the module docstring."""

    name = "spawn_python"
    schema = {"type": "object", "additionalProperties": False}

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """See the module docstring."""
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", "print(6 * 7)"], capture_output=True, text=True, check=True, timeout=60
        )
        return {"printed": done.stdout.strip(), "pid": os.getpid()}


@register
class MemoryLimits(JobType):
    """Report the address-space limits; see the module docstring."""

    name = "memory_limits"
    schema = {"type": "object", "additionalProperties": False}

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """See the module docstring."""
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        return {"pid": os.getpid(), "soft": soft, "hard": hard}
