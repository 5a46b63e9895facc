"""A process that owns a RunnerPool, for orphan tests: ``python -m tests.support.pool_owner SLOTS``.

It starts the pool, gives every runner a long job (``sleep`` 600 s) except one that stays idle,
prints one JSON line ``{"pids": [...]}`` on stdout, then waits forever. Tests ``kill -9`` it and
check that every runner process goes with it.
"""

from __future__ import annotations

import asyncio
import json
import sys

from worker.attempt import Completion, JobSpec
from worker.pool import PoolConfig, RunnerPool


async def main(slots: int) -> None:
    """Start a pool, occupy all but one runner, report the pids, wait."""

    def ignore(completion: Completion) -> None:
        pass

    pool = RunnerPool(PoolConfig(slots=slots), ignore)
    await pool.start()
    for i in range(slots - 1):
        pool.submit(JobSpec(f"owner-{i}", 1, "sleep", '{"seconds": 600}'))
    print(json.dumps({"pids": pool.pids()}), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 2))
