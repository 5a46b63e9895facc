"""Running a test body against a started RunnerPool, stopped whatever the body does."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from worker.pool import RunnerPool


class HasPool(Protocol):
    """A test's bundle of a pool and what it records."""

    pool: RunnerPool


B = TypeVar("B", bound=HasPool)


def with_pool(make: Callable[[], B], body: Callable[[B], Awaitable[None]]) -> None:
    """Make the bundle on a new event loop, start its pool, run ``body`` on it, then stop the pool."""

    async def main() -> None:
        bundle = make()
        await bundle.pool.start()
        try:
            await body(bundle)
        finally:
            await bundle.pool.stop()

    asyncio.run(main())
