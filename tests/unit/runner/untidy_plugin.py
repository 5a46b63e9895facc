"""Job types that leave things behind, or use ``sys.stdout`` as a file (load with
``--import tests.unit.runner.untidy_plugin``).

* ``background_sleeper`` {}: runs ``sh -c "sleep 60 &"`` (the shell exits at once, its ``sleep`` runs
  on, orphaned) and returns ``{"pid": the runner's pid, "sleeper": the sleep's pid}``.
* ``stray_printer`` {"daemon"?: bool}: starts a thread (daemon by default) that prints ``stray N`` lines
  forever, and returns ``{"pid": the runner's pid}`` at once.
* ``witness`` {}: prints ``witness``, then, if a stray printer runs in this process, waits (up to
  :data:`WAIT_SEC`) until it printed a few more lines, so that they would land in this job's output
  if they could; returns ``{"pid": the runner's pid, "strays": whether one runs here}``.
* ``byte_writer`` {}: reconfigures ``sys.stdout`` as jobs do, prints text, writes to
  ``sys.stdout.buffer`` (one character split across two writes, a lone bad byte, and last the start of
  a character never finished), and returns ``{}``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

from runner.registry import JobContext, JobType, register

WAIT_SEC = 10.0
STRAY_NAME = "stray-printer"
_EMPTY = {"type": "object", "additionalProperties": False}

_printed = 0
"""Lines the stray printer printed in this process."""


@register
class BackgroundSleeper(JobType):
    """Leave a ``sleep`` running in the background, orphaned by the shell that started it."""

    name = "background_sleeper"
    schema = _EMPTY

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """See the module docstring."""
        # The sleeper's output goes elsewhere, so that it does not hold the pipe run() reads to its end.
        shell = subprocess.run(
            ["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True
        )
        return {"pid": os.getpid(), "sleeper": int(shell.stdout)}


def _print_forever() -> None:
    global _printed
    while True:
        print(f"stray {_printed}")
        _printed += 1
        time.sleep(0.005)


@register
class StrayPrinter(JobType):
    """Leave a thread printing forever."""

    name = "stray_printer"
    schema = {"type": "object", "properties": {"daemon": {"type": "boolean"}}, "additionalProperties": False}

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """See the module docstring."""
        daemon = bool(payload.get("daemon", True))
        threading.Thread(target=_print_forever, name=STRAY_NAME, daemon=daemon).start()
        return {"pid": os.getpid()}


@register
class Witness(JobType):
    """Print a line, and give a stray printer in this process time to print into this job's output."""

    name = "witness"
    schema = _EMPTY

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """See the module docstring."""
        print("witness")
        strays = any(t.name == STRAY_NAME and t.is_alive() for t in threading.enumerate())
        if strays:
            until = time.monotonic() + WAIT_SEC
            start = _printed
            while _printed < start + 3 and time.monotonic() < until:
                time.sleep(0.005)
        return {"pid": os.getpid(), "strays": strays}


@register
class ByteWriter(JobType):
    """Use ``sys.stdout`` as jobs written for a terminal do: its binary buffer and ``reconfigure``."""

    name = "byte_writer"
    schema = _EMPTY

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """See the module docstring."""
        sys.stdout.reconfigure(encoding="utf-8", errors="replace", line_buffering=True)  # type: ignore[union-attr]
        print("text")
        encoded = "bytes é\n".encode()
        sys.stdout.buffer.write(encoded[:7])  # "é" is split between the two writes
        sys.stdout.buffer.write(encoded[7:])
        sys.stdout.buffer.write(b"bad \xff\n")
        sys.stdout.buffer.flush()
        print("more text", file=sys.stderr)
        sys.stdout.buffer.write(b"end \xe2\x82")  # the first two of the three bytes of "€"
        return {}
