"""Sharing the event loop: work over many items split into chunks, with a loop turn between chunks.

Everything the control plane does runs on one event loop, so one long step holds up every call and
every worker's results behind it. A batch of 10,000 submissions held every other call for about half
a second when it was converted, checked and answered in one go.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import TypeVar

T = TypeVar("T")

CHUNK = 1000
"""Items handled per loop turn."""


async def in_turns(items: Sequence[T], chunk: int = CHUNK) -> AsyncIterator[tuple[int, Sequence[T]]]:
    """``(start, items[start:start + chunk])`` for each chunk, yielding to the loop between them."""
    for start in range(0, len(items), chunk):
        if start:
            await asyncio.sleep(0)
        yield start, items[start : start + chunk]
