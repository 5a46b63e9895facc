"""RunnerPool with runners that get stuck: one that hangs as it exits, and replacements slow to start.

Real runner processes (with :mod:`tests.unit.worker.stuck_plugin`), real signals, real pipes. Tests
wait on conditions with deadlines, never on sleeps.
"""

from __future__ import annotations

import json
import os
import time
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
PLUGINS = ("tests.unit.worker.stuck_plugin",)
STALL_FILE_ENV = "CORRAL_TEST_STALL_FILE"
"""The plug-in's import sleeps as many seconds as this file says, once it exists (not imported from the
plug-in: that would register its job type in the test process too)."""
RETIRE_GRACE = 0.5
"""RETIRE_GRACE_SEC in these tests (5 s by default), so that a runner that hangs as it exits costs
little time."""


@pytest.fixture(autouse=True)
def _importable_test_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    # Runner processes import the plug-in; make the repository root importable for them.
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(worker.pool, "RETIRE_GRACE_SEC", RETIRE_GRACE)


class Bundle:
    """A pool and the completions it reported, with the time each arrived."""

    def __init__(self, **config: Any) -> None:
        self.done: dict[str, Completion] = {}
        self.arrived: dict[str, float] = {}
        self.pool = RunnerPool(PoolConfig(slots=1, imports=PLUGINS, kill_grace_sec=0.01, **config), self._on_result)

    def _on_result(self, completion: Completion) -> None:
        assert completion.job_id not in self.done, f"two completions for {completion.job_id}"
        self.done[completion.job_id] = completion
        self.arrived[completion.job_id] = time.time()

    def submit(self, job_id: str, type_: str, payload: object, timeout: float | None = None, gpus: int = 0) -> JobSpec:
        deadline = time.time() + timeout if timeout is not None else None
        spec = JobSpec(job_id, 1, type_, json.dumps(payload), 1, deadline, gpus)
        assert self.pool.submit(spec)
        return spec

    async def result(self, job_id: str, within: float) -> Completion:
        await until(lambda: job_id in self.done, within, f"a completion of {job_id}")
        return self.done[job_id]


def scenario(body: Callable[[Bundle], Awaitable[None]], **config: Any) -> None:
    with_pool(lambda: Bundle(**config), body)


@pytest.mark.parametrize(
    ("why", "config", "gpus", "hang"),
    [
        ("max_jobs", {"max_jobs": 1}, 0, "leave_thread"),
        # A job that leaves a thread is its runner's last; this one leaves the runner fit for more jobs.
        ("renewed for a GPU job", {"gpus": ("0",)}, 1, "hang_at_exit"),
    ],
)
def test_a_retired_runner_that_hangs_as_it_exits_is_killed_and_replaced(
    why: str, config: dict[str, Any], gpus: int, hang: str
) -> None:
    async def body(b: Bundle) -> None:
        # Given one slot whose runner retires after its job (max_jobs=1), or is renewed before a GPU job,
        # and a job that makes its exit hang: a non-daemon thread left running (its sys.exit waits for
        # it), or an exit handler that sleeps
        b.submit("leaves", hang, {"seconds": 600})
        leaves = await b.result("leaves", 10)
        assert leaves.outcome is Outcome.SUCCEEDED, leaves.error_message
        old = json.loads(leaves.result_json)["pid"]
        # When the next job comes
        b.submit("next", "leave_thread", {"seconds": 0}, gpus=gpus)
        # Then it runs within a few seconds, in a new runner, and the old one is gone
        nxt = await b.result("next", RETIRE_GRACE + 5)
        assert nxt.outcome is Outcome.SUCCEEDED, nxt.error_message
        assert json.loads(nxt.result_json)["pid"] != old
        await until(lambda: not alive(old), 5, "the old runner to be gone")
        assert b.pool.restarts >= 1

    scenario(body, **config)


@pytest.mark.serial  # times a bound in milliseconds: beside other tests it would time their load
@pytest.mark.parametrize(("replacement", "import_sec"), [("slow to start", 1.5), ("never ready", 3600)])
def test_a_queued_job_is_handed_back_at_its_deadline_while_its_runner_is_replaced(
    replacement: str, import_sec: float, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stall = tmp_path / "stall"
    monkeypatch.setenv(STALL_FILE_ENV, str(stall))

    async def body(b: Bundle) -> None:
        # Given one slot whose runner retires after each job, and a replacement that takes longer to
        # start than the job queued behind the first one may wait (or never becomes ready)
        stall.write_text(str(import_sec))
        b.submit("first", "noop", {})
        queued = b.submit("queued", "noop", {}, timeout=0.3)
        assert b.pool.queued == 1
        assert (await b.result("first", 10)).outcome is Outcome.SUCCEEDED
        # Then the queued job is handed back at its deadline, without running (no attempt spent)
        done = await b.result("queued", 5)
        assert queued.deadline is not None
        assert b.arrived["queued"] - queued.deadline < 0.2
        assert (done.outcome, done.error_code) == (Outcome.HANDED_BACK, "HANDED_BACK")
        assert "before it started" in done.error_message, done.error_message
        assert done.started_at == done.finished_at
        assert (b.pool.queued, b.pool.busy, b.pool.attempts()) == (0, 0, [])
        assert await b.pool.wait_idle(1)
        if replacement == "slow to start":  # and once the replacement is ready, the job still never runs
            await until(lambda: b.pool.idle == 1, 10, "the replacement to be ready")
            assert set(b.done) == {"first", "queued"} and b.pool.busy == 0

    scenario(body, max_jobs=1)


@pytest.mark.serial  # times a bound in milliseconds: beside other tests it would time their load
@pytest.mark.parametrize(
    ("stall_with", "timeout", "config", "within", "whole_within"),
    [
        # replacements that die as they start (the plug-in's import exits)
        pytest.param("crash", 1.0, {}, 5, 15, id="replacements die as they start"),
        # a replacement whose plug-in import hangs: killed once start_timeout_sec has passed, it counts as
        # one that died as it started
        pytest.param("3600", 3.0, {"start_timeout_sec": 1.0}, 10, 20, id="replacement import hangs"),
    ],
)
def test_a_queued_job_times_out_when_its_runner_s_replacements_die_or_hang_as_they_start(
    stall_with: str,
    timeout: float,
    config: dict[str, Any],
    within: float,
    whole_within: float,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stall = tmp_path / "stall"
    monkeypatch.setenv(STALL_FILE_ENV, str(stall))

    async def body(b: Bundle) -> None:
        # Given one slot whose runner retires after each job, and replacements that die as they start, or
        # whose import hangs
        stall.write_text(stall_with)
        b.submit("first", "noop", {})
        b.submit("queued", "noop", {}, timeout=timeout)
        assert (await b.result("first", 10)).outcome is Outcome.SUCCEEDED
        # Then the queued job is not handed back (it would go round without end, unseen) but ends TIMEOUT,
        # spending an attempt, and says why
        done = await b.result("queued", within)
        assert (done.outcome, done.error_code) == (Outcome.TIMEOUT, "TIMEOUT"), done.error_message
        assert "runner processes die as they start" in done.error_message, done.error_message
        stall.unlink()  # and once the plug-in imports again, the pool is whole
        await until(lambda: b.pool.idle == 1, whole_within, "a replacement to be ready")

    scenario(body, max_jobs=1, **config)
