"""Job types that use ``sys.stdout`` and ``sys.stderr`` as scripts do: they wrap, close or detach them
(load with ``--import tests.unit.runner.stream_plugin``).

* ``stream_wrapper`` {}: writes through an ``io.TextIOWrapper`` over ``sys.stdout.buffer`` and drops it
  (collected, it closes the buffer under it), closes ``sys.stderr``, then prints ``after``; returns ``{}``.
* ``stream_detacher`` {}: rewraps its output, ``sys.stdout = io.TextIOWrapper(sys.stdout.detach(), ...)``,
  prints ``detached`` through it and returns ``{}``.
"""

from __future__ import annotations

import gc
import io
import sys
from typing import Any, cast

from runner.registry import JobContext, JobType, register

_EMPTY = {"type": "object", "additionalProperties": False}


@register
class StreamWrapper(JobType):
    """Write through a dropped wrapper of ``sys.stdout.buffer``, and close ``sys.stderr``."""

    name = "stream_wrapper"
    schema = _EMPTY

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """See the module docstring."""
        wrapper = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", errors="replace")
        wrapper.write("wrapped é\n")
        wrapper.flush()
        del wrapper
        gc.collect()  # gone for sure: a collected wrapper closes the buffer it wraps
        sys.stderr.close()
        print("after", flush=True)
        return {}


@register
class StreamDetacher(JobType):
    """Rewrap ``sys.stdout`` around what ``detach()`` gives, as scripts that force UTF-8 do."""

    name = "stream_detacher"
    schema = _EMPTY

    def run(self, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        """See the module docstring."""
        detached = cast(io.TextIOWrapper, sys.stdout).detach()
        sys.stdout = io.TextIOWrapper(detached, encoding="utf-8", line_buffering=True)
        print("detached")
        return {}
