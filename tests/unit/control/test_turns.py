"""Large batches share the event loop: other calls run between chunks of a SubmitJobs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from control.api import convert
from control.api.jobs import JobServicer
from control.clock import SystemClock
from control.config import ControlConfig
from control.scheduler import Scheduler
from control.store import SQLiteStore
from control.store.rows import insert_row
from control.turns import CHUNK, in_turns
from corral.v1 import jobs_pb2
from tests.support.calls import struct


class NoMetadata:
    """The servicer context of a call without metadata (the servicer only reads it: no per-client rate limit)."""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()


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
            context: Any = NoMetadata()
            answer = await jobs.SubmitJobs(request, context)
            during = turns - before
        finally:
            other.cancel()
            store.close()
        # Then every job is answered, in order, and other work ran between the chunks: two turns each
        # while the request is converted, while the jobs are checked, while they are made, and while
        # the answer is built
        assert [j.payload["seconds"] for j in answer.jobs] == [i % 5 for i in range(n)]
        assert during >= 8, during

    asyncio.run(main())


def test_a_large_batch_made_in_turns_keeps_its_order_whatever_is_submitted_meanwhile(tmp_path: Path) -> None:
    async def main() -> None:
        # Given a large batch, and another client submitting one job at every turn of the loop meanwhile
        store = SQLiteStore(str(tmp_path / "c.db"))
        scheduler = Scheduler(store, ControlConfig.from_env({}), SystemClock())
        jobs = JobServicer(scheduler)
        context: Any = NoMetadata()
        n = CHUNK * 2
        batch = jobs_pb2.SubmitJobsRequest(
            jobs=[jobs_pb2.SubmitJobRequest(type="sleep", payload=struct({"seconds": i})) for i in range(n)]
        )
        singles: list[str] = []
        done = False

        async def other_client() -> None:
            while not done and len(singles) < 1000:  # bounded: a batch that never ends must not fill the disk
                (job,) = await scheduler.intake.submit([convert.submission(jobs_pb2.SubmitJobRequest(type="noop"))])
                singles.append(job.id)
                await asyncio.sleep(0)  # a submission that commits at once never gives the loop up by itself

        other = asyncio.ensure_future(other_client())
        try:
            await asyncio.sleep(0)
            answer = await jobs.SubmitJobs(batch, context)
            done = True
            await other
            # (the rows stored, made in turns beside the records, read back as the records are)
            stored = await store.get_many([job.id for job in answer.jobs])
        finally:
            done = True
            await other
            store.close()

        # Then the other client's jobs went in meanwhile
        seq = {job_id: job.seq for job_id, job in scheduler.active.items()}
        batch_seqs = [seq[job.id] for job in answer.jobs]
        assert len(singles) >= 4, len(singles)

        # And the batch's jobs follow one another, in its order, with none of the others among them
        assert batch_seqs == list(range(batch_seqs[0], batch_seqs[0] + n))
        inside = [job_id for job_id in singles if batch_seqs[0] <= seq[job_id] <= batch_seqs[-1]]
        assert inside == [], f"{len(inside)} jobs submitted meanwhile landed inside the batch"

        # And what is stored of each job is what the control plane holds
        held = [scheduler.active[job.id] for job in answer.jobs]
        assert sorted(insert_row(job) for job in stored) == sorted(insert_row(job) for job in held)

        # And the queue offers the batch in its order
        page = scheduler.queue("sleep", limit=n, offset=0)
        assert [q.job.id for q in page.jobs] == [job.id for job in answer.jobs]

    asyncio.run(main())
