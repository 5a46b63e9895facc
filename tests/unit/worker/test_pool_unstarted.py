"""RunnerPool: an attempt whose deadline passes before it started (it waited for a runner process) is
reported HANDED_BACK, not TIMEOUT: it never ran, so it goes back in line with no attempt spent. Real
runner processes; waits on conditions with deadlines."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.pools import with_pool
from tests.support.waiting import until
from worker.attempt import Completion, JobSpec, Outcome
from worker.pool import PoolConfig, RunnerPool

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _importable_test_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


class Bundle:
    """A one-slot pool and the completions it reported."""

    def __init__(self, **config: Any) -> None:
        self.done: dict[str, Completion] = {}
        self.pool = RunnerPool(PoolConfig(slots=1, imports=("tests.support.jobtypes",), **config), self._on_result)

    def _on_result(self, completion: Completion) -> None:
        assert completion.job_id not in self.done, f"two completions for {completion.job_id}"
        self.done[completion.job_id] = completion

    def submit(self, job_id: str, type_: str, payload: dict[str, Any], timeout: float | None = None) -> JobSpec:
        deadline = time.time() + timeout if timeout is not None else None
        spec = JobSpec(job_id, 1, type_, json.dumps(payload), 1, deadline, timeout_sec=timeout or 0.0)
        assert self.pool.submit(spec)
        return spec

    async def result(self, job_id: str, within: float = 10.0) -> Completion:
        await until(lambda: job_id in self.done, within, f"a completion of {job_id}")
        return self.done[job_id]


def test_a_job_whose_deadline_passes_while_its_runner_is_replaced_is_handed_back_never_run() -> None:
    async def body(b: Bundle) -> None:
        # Given a job that crashes its slot's runner, and one queued behind it with a short timeout
        b.submit("crash", "crash", {"how": "exit"})
        queued = b.submit("queued", "record", {"path": "/nonexistent/never-written"}, timeout=0.05)
        crashed = await b.result("crash")
        assert (crashed.outcome, crashed.error_code) == (Outcome.FAILED, "CRASHED")
        # When its deadline passes before the replacement runner is ready to take it
        done = await b.result("queued")
        # Then it is handed back at its deadline, never having run (no attempt spent), saying why
        assert (done.outcome, done.error_code) == (Outcome.HANDED_BACK, "HANDED_BACK"), done.error_message
        assert "deadline passed before it started" in done.error_message, done.error_message
        assert "for a runner process" in done.error_message, done.error_message
        assert done.started_at == done.finished_at
        assert queued.deadline is not None and done.finished_at >= queued.deadline
        assert (b.pool.queued, b.pool.busy, b.pool.attempts()) == (0, 0, [])
        # And the slot still runs the next job on its new runner
        b.submit("after", "record", {"path": os.devnull})
        assert (await b.result("after")).outcome is Outcome.SUCCEEDED

    with_pool(Bundle, body)


def test_a_job_that_started_late_is_still_stopped_at_its_deadline_counted_from_its_assignment() -> None:
    async def body(b: Bundle) -> None:
        # Given a job queued behind another, with a deadline that passes after it started
        b.submit("blocker", "record", {"path": os.devnull, "seconds": 0.3})
        late = b.submit("late", "record", {"path": os.devnull, "seconds": 30}, timeout=1.0)
        # Then it is killed at that deadline (not one moved to its start) and reported TIMEOUT
        done = await b.result("late", 15)
        assert (done.outcome, done.error_code) == (Outcome.TIMEOUT, "TIMEOUT"), done.error_message
        assert late.deadline is not None and done.started_at < late.deadline <= done.finished_at < late.deadline + 1

    with_pool(Bundle, body)
