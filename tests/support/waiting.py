"""Waiting on conditions with a deadline, from async tests (never a bare sleep to synchronise)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest


async def until(predicate: Callable[[], object], within: float = 10.0, what: str = "") -> None:
    """Wait until ``predicate()`` is truthy, checking every few milliseconds; fail after ``within`` s."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {within}s waiting for {what or predicate}")
        await asyncio.sleep(0.002)


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run the blocking ``fn`` on a thread of its own (while the test breaks things); the dict gets
    ``value`` or ``error`` when it ends."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except Exception as exc:  # handed to the test, which asserts on it
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out
