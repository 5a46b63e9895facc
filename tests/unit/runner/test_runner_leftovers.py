"""What a job leaves running ends with it: a process orphaned in the background, a thread that prints on.

Real runner processes in a real RunnerPool (with :mod:`tests.unit.runner.untidy_plugin`), real signals;
waits are on conditions with deadlines, never sleeps.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import worker.pool
from tests.support.pools import with_pool
from tests.support.processes import alive
from tests.support.waiting import until
from worker.attempt import Completion, JobSpec, Outcome
from worker.pool import PoolConfig, RunnerPool

ROOT = Path(__file__).resolve().parents[3]
PLUGINS = ("tests.unit.runner.untidy_plugin",)
RETIRE_GRACE = 0.5
"""RETIRE_GRACE_SEC here (5 s by default): a runner kept from exiting by a non-daemon thread is killed then."""


@pytest.fixture(autouse=True)
def _importable_test_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    # Runner processes import the plug-in; make the repository root importable for them.
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setattr(worker.pool, "RETIRE_GRACE_SEC", RETIRE_GRACE)


class Bundle:
    """A one-slot pool that catches output, and the completions it reported."""

    def __init__(self) -> None:
        self.done: dict[str, Completion] = {}
        config = PoolConfig(slots=1, imports=PLUGINS, kill_grace_sec=0.01, output_bytes=4096)
        self.pool = RunnerPool(config, self._on_result)

    def _on_result(self, completion: Completion) -> None:
        assert completion.job_id not in self.done, f"two completions for {completion.job_id}"
        self.done[completion.job_id] = completion

    async def run(self, job_id: str, type_: str, payload: object) -> tuple[Completion, dict[str, Any]]:
        """Submit a job and wait for its completion, which must be a success; it and its result."""
        assert self.pool.submit(JobSpec(job_id, 1, type_, json.dumps(payload), 1, None))
        await until(lambda: job_id in self.done, 20, f"a completion of {job_id}")
        done = self.done[job_id]
        assert done.outcome is Outcome.SUCCEEDED, done.error_message
        return done, json.loads(done.result_json)


def scenario(body: Callable[[Bundle], Awaitable[None]]) -> None:
    with_pool(Bundle, body)


def test_a_process_a_job_left_in_the_background_ends_and_its_runner_is_replaced() -> None:
    sleeper = 0

    async def body(b: Bundle) -> None:
        nonlocal sleeper
        # Given a job whose shell starts a sleep in the background and exits, orphaning it
        _, result = await b.run("leaves", "background_sleeper", {})
        sleeper, runner = result["sleeper"], result["pid"]
        # Then the sleep is gone within a few seconds, and so is the runner that ran the job (which ends
        # the sleep itself as it exits, so the pool may learn of its exit a moment after)
        await until(lambda: not alive(sleeper), 10, "the background sleep to end")
        await until(lambda: not alive(runner) and b.pool.restarts >= 1, 10, "the runner to be replaced")
        # And the next job runs in a fresh runner
        _, after = await b.run("after", "witness", {})
        assert after["pid"] != runner

    try:
        scenario(body)
    finally:
        if sleeper:
            with contextlib.suppress(ProcessLookupError):
                os.kill(sleeper, signal.SIGKILL)


@pytest.mark.parametrize("daemon", [True, False], ids=["daemon", "non-daemon"])
def test_a_thread_a_job_left_prints_into_no_later_job_and_its_runner_is_replaced(daemon: bool) -> None:
    async def body(b: Bundle) -> None:
        # Given a job that returns leaving a thread that prints forever
        _, left = await b.run("leaves", "stray_printer", {"daemon": daemon})
        # When the next job runs on the same one-slot pool
        done, witness = await b.run("next", "witness", {})
        # Then it ran in another runner, and its output is its own
        assert done.output == "witness\n", done.output
        assert witness["pid"] != left["pid"] and not witness["strays"]
        # And the runner with the thread is gone (a non-daemon thread holds it until RETIRE_GRACE_SEC)
        await until(lambda: not alive(left["pid"]), 10, "the runner with the thread to be gone")
        assert b.pool.restarts >= 1

    scenario(body)
