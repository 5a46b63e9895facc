"""Kernel jobs in a real RunnerPool: the per-job memory limit and kills at the deadline.

Real runner processes, real signals; waits are on conditions with deadlines, never sleeps.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from runner.limits import ENV, memory_limit_from_env
from tests.support.pools import with_pool
from tests.support.processes import alive
from tests.support.waiting import until
from worker.attempt import Completion, JobSpec, Outcome
from worker.pool import PoolConfig, RunnerPool, RunnerStartError

ROOT = Path(__file__).resolve().parents[3]
GRACE = 0.025
BOUND = 0.050  # the figure: a job is killed within 50 ms of its deadline (+ SIGTERM grace)
TOO_BIG = {"n": 6000}  # matmul: three 6000 x 6000 float64 matrices, ~860 MB


class Pool:
    """A started pool and the completions it reported (with their arrival times)."""

    def __init__(self, slots: int, memory_limit_mb: int | None) -> None:
        self.done: dict[str, Completion] = {}
        self.arrived: dict[str, float] = {}
        config = PoolConfig(slots=slots, kill_grace_sec=GRACE, memory_limit_mb=memory_limit_mb)
        self.pool = RunnerPool(config, self._on_result)

    def _on_result(self, completion: Completion) -> None:
        self.done[completion.job_id] = completion
        self.arrived[completion.job_id] = time.time()

    def submit(
        self, job_id: str, type_: str, payload: object, threads: int = 1, timeout: float | None = None
    ) -> JobSpec:
        deadline = time.time() + timeout if timeout is not None else None
        spec = JobSpec(job_id, 1, type_, json.dumps(payload), threads, deadline)
        assert self.pool.submit(spec)
        return spec

    async def result(self, job_id: str, within: float = 60.0) -> Completion:
        await until(lambda: job_id in self.done, within, f"a completion of {job_id}")
        return self.done[job_id]

    async def full(self) -> None:
        slots = self.pool.config.slots
        await until(lambda: self.pool.idle == slots and len(self.pool.pids()) == slots, 30, "a full idle pool")


def scenario(body: Callable[[Pool], Awaitable[None]], slots: int = 1, memory_limit_mb: int | None = 0) -> None:
    with_pool(lambda: Pool(slots, memory_limit_mb), body)


@pytest.fixture(autouse=True)
def _no_limit_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)


# -- the memory limit ----------------------------------------------------------------------------------------


def test_a_job_past_the_memory_limit_fails_memory_limit_and_its_process_is_replaced() -> None:
    async def body(p: Pool) -> None:
        await p.full()
        [first] = p.pool.pids()
        # Given a job within the limit, it runs
        p.submit("small", "matmul", {"n": 200}, threads=2)
        assert (await p.result("small")).outcome is Outcome.SUCCEEDED
        # When a job needs far more than 64 MiB
        p.submit("big", "matmul", TOO_BIG, threads=2)
        done = await p.result("big")
        # Then it fails with MEMORY_LIMIT, saying what the limit is
        assert (done.outcome, done.error_code) == (Outcome.FAILED, "MEMORY_LIMIT")
        assert "64 MiB" in done.error_message and "CORRAL_JOB_MEMORY_LIMIT_MB" in done.error_message
        # and its process is replaced: the pool is back to its size, with a new process
        await p.full()
        await until(lambda: not alive(first), 10, "the old runner to exit")
        assert p.pool.restarts == 1 and p.pool.pids() != [first]
        # and the next job runs
        p.submit("after", "matmul", {"n": 50})
        assert (await p.result("after")).outcome is Outcome.SUCCEEDED

    scenario(body, memory_limit_mb=64)


def test_without_a_limit_the_same_job_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    async def body(p: Pool) -> None:
        p.submit("big", "matmul", {"n": 1500}, threads=2)
        assert (await p.result("big")).outcome is Outcome.SUCCEEDED
        assert p.pool.restarts == 0

    scenario(body, memory_limit_mb=0)


def test_the_limit_comes_from_the_worker_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "64")

    async def body(p: Pool) -> None:
        p.submit("big", "matmul", TOO_BIG)
        assert (await p.result("big")).error_code == "MEMORY_LIMIT"
        await p.full()

    scenario(body, memory_limit_mb=None)


def test_a_malformed_limit_stops_the_pool_from_starting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "lots")

    async def main() -> None:
        pool = RunnerPool(PoolConfig(slots=1), lambda c: None)
        with pytest.raises(RunnerStartError, match=ENV):
            await pool.start()

    asyncio.run(main())


@pytest.mark.parametrize(("raw", "value"), [("", 0), ("0", 0), (" 512 ", 512)])
def test_memory_limit_from_env(raw: str, value: int) -> None:
    assert memory_limit_from_env({ENV: raw}) == value
    assert memory_limit_from_env({}) == 0


@pytest.mark.parametrize("raw", ["-1", "1.5", "1G"])
def test_memory_limit_from_env_refuses(raw: str) -> None:
    with pytest.raises(ValueError, match=ENV):
        memory_limit_from_env({ENV: raw})


def test_the_limit_is_on_top_of_the_idle_runner() -> None:
    # A process limited to +32 MiB can still allocate 16 MiB, but not 64 MiB.
    code = (
        "from runner.limits import apply_memory_limit; apply_memory_limit(32)\n"
        "a = bytearray(16 << 20)\n"
        "try:\n    bytearray(64 << 20)\nexcept MemoryError:\n    print('refused')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "refused", done.stderr


# -- kernel jobs at their deadline ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("type_", "payload"),
    [
        ("cpu_intensive", {"rounds": 10**10}),
        ("cpu_intensive", {"n": 10**11}),
        ("matmul", {"n": 4000}),
        ("monte_carlo_pi", {"samples": 10**12}),
    ],
)
@pytest.mark.serial  # times a bound in milliseconds: beside other tests it would time their load
def test_a_compiled_kernel_is_killed_at_its_deadline_within_the_bound(type_: str, payload: dict[str, int]) -> None:
    async def body(p: Pool) -> None:
        await p.full()
        before = set(p.pool.pids())
        # Given a two-thread kernel job that would run for minutes, inside nogil code, with a 0.4 s deadline
        spec = p.submit("slow", type_, payload, threads=2, timeout=0.4)
        done = await p.result("slow")
        # Then it is reported TIMEOUT within 50 ms of deadline + grace, its process is gone
        assert (done.outcome, done.error_code) == (Outcome.TIMEOUT, "TIMEOUT")
        assert spec.deadline is not None
        assert spec.deadline <= p.arrived["slow"] < spec.deadline + GRACE + BOUND
        assert not any(alive(pid) for pid in before)
        # And a fresh process serves the next job
        await p.full()
        assert not set(p.pool.pids()) & before
        p.submit("next", "cpu_intensive", {"n": 1000}, threads=2)
        assert json.loads((await p.result("next")).result_json) == {"primes": 168}

    scenario(body)
