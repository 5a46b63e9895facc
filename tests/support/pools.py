"""Running a test body against a started RunnerPool, stopped whatever the body does; a one-slot pool
that runs one job after another."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from tests.support.waiting import until
from worker.attempt import Completion, JobSpec
from worker.pool import PoolConfig, RunnerPool


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


class OneSlotPool:
    """A one-slot RunnerPool that imports the plug-ins ``imports`` (and takes the rest of ``config``),
    and the completions it reported, by job id.

    For tests of what one runner process makes of one job after another (a job that fails oddly, one
    that fights its memory limit): with a single slot, each job runs in the runner the one before it
    left behind, or in that runner's replacement, so a test can tell which. Use with :func:`with_pool`.
    """

    def __init__(self, imports: tuple[str, ...], **config: Any) -> None:
        self.done: dict[str, Completion] = {}
        self.pool = RunnerPool(PoolConfig(slots=1, imports=imports, **config), self._on_result)

    def _on_result(self, completion: Completion) -> None:
        self.done[completion.job_id] = completion

    async def run(
        self, job_id: str, type_: str, payload: object, timeout_sec: float | None = None, within: float = 60
    ) -> Completion:
        """Submit attempt 1 of ``job_id`` (one thread; with ``timeout_sec``, that job timeout and a deadline
        that far from now), and return its completion, failing the test if none comes within ``within`` s.
        """
        deadline = time.time() + timeout_sec if timeout_sec is not None else None
        spec = JobSpec(job_id, 1, type_, json.dumps(payload), 1, deadline, timeout_sec=timeout_sec or 0.0)
        assert self.pool.submit(spec)
        await until(lambda: job_id in self.done, within, f"a completion of {job_id}")
        return self.done[job_id]
