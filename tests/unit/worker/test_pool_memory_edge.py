"""Under a per-job memory limit, a job may use as many threads as the worker has (its thread demand)
though they are more than the machine's CPUs: the kernels' threads are started before the limit, with
the rest of an idle runner, and do not count against the job. Real runner processes."""

from __future__ import annotations

import json
import os

from tests.support.pools import with_pool
from tests.support.waiting import until
from worker import Agent, WorkerConfig
from worker.attempt import Completion, JobSpec, Outcome
from worker.pool import PoolConfig, RunnerPool

LIMIT_MB = 32
"""The job's memory: far less than the stacks (8 MiB each) of the threads below, if they counted."""
THREADS = (os.cpu_count() or 1) + 32
"""The worker's threads, more than the machine's CPUs (``corral up --threads 4`` on a 2-CPU machine)."""


class Bundle:
    """A pool with the memory limit and the completions it reported."""

    def __init__(self) -> None:
        self.done: list[Completion] = []
        config = PoolConfig(slots=1, memory_limit_mb=LIMIT_MB, threads=THREADS)
        self.pool = RunnerPool(config, self.done.append)


def test_a_job_with_all_the_workers_threads_runs_within_the_memory_limit() -> None:
    async def body(bundle: Bundle) -> None:
        pid = bundle.pool.pids()[0]
        # Given a job that runs a compiled kernel over all the worker's threads
        payload = json.dumps({"rounds": 1000, "seed": 7})
        assert bundle.pool.submit(JobSpec("hash", 1, "cpu_intensive", payload, THREADS))
        await until(lambda: bool(bundle.done), 30.0, "the job's completion")
        # Then it succeeds, in the same runner (which did not die starting threads past its limit)
        (completion,) = bundle.done
        assert completion.outcome is Outcome.SUCCEEDED, completion
        assert json.loads(completion.result_json)["rounds"] == 1000
        assert bundle.pool.pids() == [pid]

    with_pool(Bundle, body)


def test_the_agent_gives_its_pool_the_workers_threads() -> None:
    assert Agent(WorkerConfig(threads=5)).pool.config.threads == 5
