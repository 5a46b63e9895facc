"""Large batches share the event loop: other calls run between chunks of a SubmitJobs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from control.api.jobs import JobServicer
from control.clock import SystemClock
from control.config import ControlConfig
from control.scheduler import Scheduler
from control.store import SQLiteStore
from control.turns import CHUNK, in_turns
from corral.v1 import jobs_pb2
from tests.support.calls import struct


def test_in_turns_hands_out_every_item_once_in_order_with_its_index() -> None:
    async def collect() -> list[tuple[int, list[int]]]:
        return [(start, list(part)) async for start, part in in_turns(list(range(7)), chunk=3)]

    assert asyncio.run(collect()) == [(0, [0, 1, 2]), (3, [3, 4, 5]), (6, [6])]


def test_a_large_submit_batch_lets_other_work_run_while_it_is_converted_checked_and_answered(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        store = SQLiteStore(str(tmp_path / "c.db"))
        jobs = JobServicer(Scheduler(store, ControlConfig.from_env({}), SystemClock()))
        n = CHUNK * 3
        request = jobs_pb2.SubmitJobsRequest(
            jobs=[jobs_pb2.SubmitJobRequest(type="sleep", payload=struct({"seconds": i % 5})) for i in range(n)]
        )
        turns = 0

        async def other_work() -> None:
            nonlocal turns
            while True:
                await asyncio.sleep(0)
                turns += 1

        other = asyncio.ensure_future(other_work())
        await asyncio.sleep(0)
        try:
            before = turns
            context: Any = None  # no per-client rate limit: the servicer does not look at the caller
            answer = await jobs.SubmitJobs(request, context)
            during = turns - before
        finally:
            other.cancel()
            store.close()
        # Then every job is answered, in order, and other work ran between the chunks: two turns each
        # while the request is converted, while the jobs are checked, and while the answer is built
        assert [j.payload["seconds"] for j in answer.jobs] == [i % 5 for i in range(n)]
        assert during >= 6, during

    asyncio.run(main())
