"""RunnerPool on its own (no control plane): real runner processes, real signals, real pipes.

Tests wait on conditions with deadlines, never on sleeps. Each test runs its own event loop
(``asyncio.run``) and stops its pool in a ``finally``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import worker
from corral.limits import MAX_ERROR_CODE, MAX_ERROR_MESSAGE_BYTES, MAX_RESULT_BYTES
from tests.support.pools import with_pool
from tests.support.processes import alive
from tests.support.waiting import until
from worker.attempt import Completion, JobSpec, Outcome
from worker.pool import PoolConfig, RunnerPool

ROOT = Path(__file__).resolve().parents[3]
PLUGINS = ("tests.support.jobtypes", "tests.support.probes")
GRACE = 0.025
BOUND = 0.050  # a killed job's process is gone within this long after deadline + grace


@pytest.fixture(autouse=True)
def _importable_test_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    # Runner processes import tests.support.jobtypes; make the repository root importable for them.
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


class Bundle:
    """A started pool and the completions it reported, with the time each arrived."""

    def __init__(self, slots: int, grace: float = GRACE, **config: Any) -> None:
        self.done: dict[tuple[str, int], Completion] = {}
        self.arrived: dict[tuple[str, int], float] = {}
        self.pool = RunnerPool(
            PoolConfig(slots=slots, imports=PLUGINS, kill_grace_sec=grace, **config), self._on_result
        )

    def _on_result(self, completion: Completion) -> None:
        key = (completion.job_id, completion.attempt)
        assert key not in self.done, f"two completions for {key}"
        self.done[key] = completion
        self.arrived[key] = time.time()

    def submit(self, job_id: str, type_: str, payload: object = None, timeout: float | None = None) -> JobSpec:
        deadline = time.time() + timeout if timeout is not None else None
        spec = JobSpec(job_id, 1, type_, json.dumps(payload or {}), 1, deadline)
        assert self.pool.submit(spec)
        return spec

    async def result(self, job_id: str, within: float = 10.0) -> Completion:
        await until(lambda: (job_id, 1) in self.done, within, f"a completion of {job_id}")
        return self.done[(job_id, 1)]

    async def full(self) -> None:
        """Wait until the pool is back to ``slots`` ready, idle processes."""
        slots = self.pool.config.slots
        await until(lambda: self.pool.idle == slots and len(self.pool.pids()) == slots, what="a full idle pool")


def scenario(slots: int, body: Callable[[Bundle], Awaitable[None]], grace: float = GRACE, **config: Any) -> None:
    with_pool(lambda: Bundle(slots, grace, **config), body)


def test_worker_exports_are_pinned():
    assert set(worker.__all__) == {
        "Agent",
        "ConfigError",
        "WorkerConfig",
        "Completion",
        "JobSpec",
        "Outcome",
        "PoolConfig",
        "RunnerPool",
        "RunnerStartError",
        "Connection",
        "Drainer",
    }


def test_runs_jobs_and_reports_results_and_failures():
    async def body(b: Bundle) -> None:
        # Given a pool of 2, when jobs of every kind are submitted (more than there are slots)
        b.submit("add", "add_numbers", {"a": 2, "b": 3.0})
        b.submit("fail", "failing", {"message": "nope"})
        b.submit("unknown", "no_such_type")
        b.submit("plugin", "py_loop", {"n": 1000})
        b.submit("text", "reverse_string", {"text": "ab😀"})
        # Then each ends with its own outcome
        add = await b.result("add")
        assert (add.outcome, json.loads(add.result_json)) == (Outcome.SUCCEEDED, {"sum": 5})
        assert add.started_at <= add.finished_at
        fail = await b.result("fail")
        assert (fail.outcome, fail.error_code, fail.error_message) == (Outcome.FAILED, "ERROR", "nope")
        unknown = await b.result("unknown")
        assert (unknown.outcome, unknown.error_code) == (Outcome.FAILED, "UNKNOWN_TYPE")
        assert json.loads((await b.result("plugin")).result_json) == {"n": 1000}
        assert json.loads((await b.result("text")).result_json) == {"reversed": "😀ba"}
        assert await b.pool.wait_idle(5)
        assert b.pool.restarts == 0

    scenario(2, body)


def test_started_since_says_whether_an_attempt_started_since_then_still_runs():
    async def body(b: Bundle) -> None:
        before = time.time()
        b.submit("long", "sleep", {"seconds": 30})
        await until(lambda: b.pool.busy == 1, what="the job to run")
        assert b.pool.started_since(before)
        assert not b.pool.started_since(time.time() + 1)
        b.pool.kill("long", 1, Outcome.CANCELLED)
        await b.result("long")
        assert not b.pool.started_since(before)

    scenario(1, body)


def test_results_and_errors_are_kept_within_what_the_stream_carries():
    async def body(b: Bundle) -> None:
        # Given jobs whose output is at, and just past, the limits
        at_limit = MAX_RESULT_BYTES - len('{"x":""}')
        b.submit("largest", "big_output", {"result_bytes": at_limit})
        b.submit("too-large", "big_output", {"result_bytes": at_limit + 1})
        b.submit("long-error", "big_output", {"error_bytes": 10 * MAX_ERROR_MESSAGE_BYTES, "code": "C" * 500})
        # Then a result at the limit arrives whole, one past it fails with a code that says so
        largest = await b.result("largest", within=30)
        assert largest.outcome == Outcome.SUCCEEDED and len(largest.result_json) == MAX_RESULT_BYTES
        too_large = await b.result("too-large", within=30)
        assert (too_large.outcome, too_large.error_code) == (Outcome.FAILED, "RESULT_TOO_LARGE")
        assert too_large.error_message.startswith(f"result: {MAX_RESULT_BYTES + 1} bytes of JSON, over the limit")
        # and an error message is cut, UTF-8 intact, its end saying how long it was
        long_error = await b.result("long-error")
        assert long_error.error_code == "C" * MAX_ERROR_CODE
        message = long_error.error_message.encode()
        assert len(message) <= MAX_ERROR_MESSAGE_BYTES and long_error.error_message.startswith("émmm")
        assert long_error.error_message.endswith(f"... (cut: {10 * MAX_ERROR_MESSAGE_BYTES + 1} bytes in all)")
        assert await b.pool.wait_idle(5)
        assert b.pool.restarts == 0

    scenario(2, body)


def test_the_same_attempt_is_not_taken_twice():
    async def body(b: Bundle) -> None:
        spec = b.submit("once", "sleep", {"seconds": 0.05})
        assert not b.pool.submit(spec)
        assert b.pool.holds("once", 1)
        assert (await b.result("once")).outcome is Outcome.SUCCEEDED

    scenario(1, body)


@pytest.mark.parametrize(
    ("type_", "payload"),
    [
        ("sleep", {"seconds": 30}),
        ("ignore_sigterm_sleep", {"seconds": 30}),
        ("native_block", {"seconds": 30}),
    ],
)
@pytest.mark.serial  # times a bound in milliseconds: beside other tests it would time their load
def test_timeout_kills_within_the_bound_and_refills_the_pool(type_: str, payload: dict[str, object]):
    async def body(b: Bundle) -> None:
        await b.full()
        before = set(b.pool.pids())
        # Given a job that would run 30 s, with a 0.3 s deadline
        spec = b.submit("slow", type_, payload, timeout=0.3)
        await until(lambda: b.pool.busy == 1)
        # When the deadline passes
        done = await b.result("slow")
        # Then it is reported TIMEOUT as soon as its process is gone, within the bound
        assert (done.outcome, done.error_code) == (Outcome.TIMEOUT, "TIMEOUT")
        assert spec.deadline is not None
        assert b.arrived[("slow", 1)] - (spec.deadline + GRACE) < BOUND
        assert b.arrived[("slow", 1)] >= spec.deadline
        gone = [pid for pid in before if not alive(pid)]
        assert len(gone) == 1, "exactly the job's process was killed"
        # And a replacement process brings the pool back to its size
        await b.full()
        assert len(set(b.pool.pids()) - before) == 1
        assert b.pool.restarts == 1

    scenario(2, body)


def test_several_timeouts_at_once_keep_the_pool_at_its_size():
    async def body(b: Bundle) -> None:
        for i in range(6):
            b.submit(f"t{i}", "sleep", {"seconds": 30}, timeout=0.1)
        # The three that ran time out; the three that waited for a process never ran, and go back
        outcomes = [(await b.result(f"t{i}")).outcome for i in range(6)]
        assert sorted(o.name for o in outcomes) == ["HANDED_BACK"] * 3 + ["TIMEOUT"] * 3, outcomes
        await b.full()
        assert len(b.pool.pids()) == 3
        assert all(alive(pid) for pid in b.pool.pids())
        b.submit("after", "noop")
        assert (await b.result("after")).outcome is Outcome.SUCCEEDED

    scenario(3, body)


@pytest.mark.serial  # times a bound in milliseconds: beside other tests it would time their load
def test_cancel_running_and_queued():
    async def body(b: Bundle) -> None:
        b.submit("running", "sleep", {"seconds": 30})
        b.submit("queued", "sleep", {"seconds": 30})
        await until(lambda: b.pool.busy == 1 and b.pool.queued == 1)
        # A queued attempt is cancelled at once, without a process
        assert b.pool.kill("queued", 1, Outcome.CANCELLED)
        assert (await b.result("queued")).outcome is Outcome.CANCELLED
        # A running one is killed, then reported
        t0 = time.time()
        assert b.pool.kill("running", 1, Outcome.CANCELLED)
        done = await b.result("running")
        assert (done.outcome, done.error_code) == (Outcome.CANCELLED, "CANCELLED")
        assert b.arrived[("running", 1)] - t0 < GRACE + BOUND
        assert not b.pool.kill("unknown", 1, Outcome.CANCELLED)
        await b.full()

    scenario(1, body)


def test_kill_without_outcome_forgets_the_attempt():
    async def body(b: Bundle) -> None:
        b.submit("rejected", "sleep", {"seconds": 30})
        await until(lambda: b.pool.busy == 1)
        assert b.pool.kill("rejected", 1, None)
        await b.full()
        assert ("rejected", 1) not in b.done
        assert b.pool.attempts() == []

    scenario(1, body)


@pytest.mark.parametrize(("how", "status"), [("exit", "exit status 7"), ("segv", "signal SIGSEGV")])
def test_a_process_that_dies_reports_crashed_and_is_replaced(how: str, status: str):
    async def body(b: Bundle) -> None:
        await b.full()
        before = set(b.pool.pids())
        b.submit("boom", "crash", {"how": how})
        done = await b.result("boom")
        assert (done.outcome, done.error_code) == (Outcome.FAILED, "CRASHED")
        assert status in done.error_message
        await b.full()
        assert set(b.pool.pids()) != before
        b.submit("next", "add_numbers", {"a": 1, "b": 1})
        assert json.loads((await b.result("next")).result_json) == {"sum": 2}

    scenario(1, body)


def test_hand_back_and_kill_all_for_drains():
    async def body(b: Bundle) -> None:
        b.submit("r1", "sleep", {"seconds": 30})
        b.submit("r2", "sleep", {"seconds": 30})
        b.submit("q1", "sleep", {"seconds": 30})
        await until(lambda: b.pool.busy == 2 and b.pool.queued == 1)
        assert sorted(a[0] for a in b.pool.attempts()) == ["q1", "r1", "r2"]
        assert b.pool.hand_back_queued() == 1
        assert (await b.result("q1")).outcome is Outcome.HANDED_BACK
        assert not await b.pool.wait_idle(0.05)
        assert b.pool.kill_all(Outcome.HANDED_BACK) == 2
        assert await b.pool.wait_idle(5)
        assert {b.done[(k, 1)].outcome for k in ("r1", "r2")} == {Outcome.HANDED_BACK}

    scenario(2, body)


def test_a_deadline_that_passed_in_the_queue_hands_the_attempt_back_without_running():
    async def body(b: Bundle) -> None:
        b.submit("blocker", "sleep", {"seconds": 0.3})
        b.submit("late", "record", {"path": "/nonexistent/never-written"}, timeout=0.05)
        done = await b.result("late")
        assert (done.outcome, done.error_code) == (Outcome.HANDED_BACK, "HANDED_BACK")
        assert (await b.result("blocker")).outcome is Outcome.SUCCEEDED

    scenario(1, body)


def test_a_runner_retires_after_max_jobs_and_no_queued_job_goes_to_it_meanwhile():
    async def body(b: Bundle) -> None:
        # Given one slot whose runner retires every 2 jobs, and 7 jobs queued at once (so the next one
        # is handed over the moment an answer arrives)
        for i in range(7):
            b.submit(f"j{i}", "leak")
        done = [await b.result(f"j{i}") for i in range(7)]
        # Then every job succeeds (none went to a runner on its way out) and each runner ran 2
        assert [c.outcome for c in done] == [Outcome.SUCCEEDED] * 7, [c.error_message for c in done]
        pids = [json.loads(c.result_json)["pid"] for c in done]
        assert [pids.count(pid) for pid in dict.fromkeys(pids)] == [2, 2, 2, 1], pids
        await b.full()

    scenario(1, body, max_jobs=2)


def test_a_runner_that_grew_past_max_rss_is_replaced_after_its_job_which_keeps_its_answer():
    async def body(b: Bundle) -> None:
        # Given one slot whose runner is replaced past 400 MiB resident (an idle one is far below)
        b.submit("small", "leak", {"mib": 1})
        b.submit("same", "leak", {"mib": 1})
        b.submit("leaky", "leak", {"mib": 500})  # a plug-in that leaks
        b.submit("after", "leak")
        small, same, leaky, after = [await b.result(j) for j in ("small", "same", "leaky", "after")]
        # Then the jobs all succeed; the small ones share a runner, and the job after the leak runs in
        # a fresh one
        assert {c.outcome for c in (small, same, leaky, after)} == {Outcome.SUCCEEDED}
        pid = {name: json.loads(c.result_json)["pid"] for name, c in (("small", small), ("same", same),
               ("leaky", leaky), ("after", after))}  # fmt: skip
        assert pid["small"] == pid["same"] == pid["leaky"] != pid["after"], pid
        await until(lambda: not alive(pid["leaky"]), 10, "the grown runner to exit")

    scenario(1, body, max_rss_mb=400)


def test_a_job_that_leaves_a_child_running_lets_the_queued_job_run_in_a_fresh_runner(tmp_path: Path):
    async def body(b: Bundle) -> None:
        # Given one slot, a job that returns leaving a child process running, and a job queued behind it
        b.submit("leaves", "pid_spawn", {"pid_path": str(tmp_path / "pid"), "seconds": 60, "detach": True})
        b.submit("next", "leak")
        # Then both succeed: the next job did not go to the runner that was on its way out
        leaves, nxt = await b.result("leaves"), await b.result("next")
        assert (leaves.outcome, nxt.outcome) == (Outcome.SUCCEEDED, Outcome.SUCCEEDED), nxt.error_message
        await until(lambda: not alive(json.loads(leaves.result_json)["child"]), 10, "the child to end")

    scenario(1, body)


def test_no_child_is_left_after_stop():
    async def main() -> None:
        b = Bundle(3)
        await b.pool.stop()  # stop before start is harmless
        await b.pool.start()
        b.submit("busy", "ignore_sigterm_sleep", {"seconds": 30})
        await until(lambda: b.pool.busy == 1)
        pids = b.pool.pids()
        assert len(pids) == 3 and all(alive(p) for p in pids)
        await b.pool.stop()
        await b.pool.stop()  # idempotent
        assert not any(alive(p) for p in pids)
        assert b.pool.pids() == []

    asyncio.run(main())


def test_a_plugin_that_does_not_import_fails_the_start():
    async def main() -> None:
        pool = RunnerPool(PoolConfig(slots=2, imports=("tests.support.no_such_module",)), lambda c: None)
        # the runner's own words reach the worker: which module, and why
        with pytest.raises(ImportError, match=r"cannot import job-type plug-in 'tests\.support\.no_such_module'"):
            await pool.start()
        assert pool.pids() == []

    asyncio.run(main())


def test_no_orphan_after_kill_9_of_the_owner():
    # Given a process that owns a pool of 3 (2 runners busy with long jobs, 1 idle)
    owner = subprocess.Popen(
        [sys.executable, "-m", "tests.support.pool_owner", "3"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline()
        pids = json.loads(line)["pids"]
        assert len(pids) == 3 and all(alive(p) for p in pids)
        # When it is killed with SIGKILL (no chance to clean up)
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        # Then every runner process dies with it
        deadline = time.monotonic() + 5
        while any(alive(p) for p in pids):
            assert time.monotonic() < deadline, f"orphans left: {[p for p in pids if alive(p)]}"
            time.sleep(0.01)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(10)
