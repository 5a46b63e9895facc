"""Waiting on conditions with a deadline, from async tests (never a bare sleep to synchronise)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest


async def until(predicate: Callable[[], object], within: float = 10.0, what: str = "") -> None:
    """Wait until ``predicate()`` is truthy, checking every few milliseconds; fail after ``within`` s."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {within}s waiting for {what or predicate}")
        await asyncio.sleep(0.002)
