"""A process a job starts that leaves its runner's process group (``setsid``, a double-forked daemon)
ends with the job all the same: when the job returns, at its timeout, when it is cancelled.

Real runner processes in a real RunnerPool (with :mod:`tests.support.escaping_jobtypes`), real signals;
the job writes the escaped pids to a file the test reads. Nothing else is touched: the pool's other
runner, and the test process's own children (one it had before the pool started, in a session of its
own, and one started while the pool runs). Waits are on conditions with deadlines, never sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import worker.pool
from tests.support.pools import with_pool
from tests.support.processes import alive, children
from tests.support.waiting import until
from worker.attempt import Completion, JobSpec, Outcome
from worker.pool import PoolConfig, RunnerPool

ROOT = Path(__file__).resolve().parents[3]
PLUGINS = ("tests.support.escaping_jobtypes",)
WITHIN = 10.0
"""How long the escaped processes may take to be gone (they are SIGKILLed: in practice milliseconds)."""


@pytest.fixture(autouse=True)
def _importable_test_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setattr(worker.pool, "RETIRE_GRACE_SEC", 1.0)


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A child of this process, in a session of its own, started before the pool: not the pool's to end."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


class Bundle:
    """A two-slot pool and the completions it reported."""

    def __init__(self) -> None:
        self.done: dict[str, Completion] = {}
        self.pool = RunnerPool(PoolConfig(slots=2, imports=PLUGINS, kill_grace_sec=0.025), self._on_result)

    def _on_result(self, completion: Completion) -> None:
        assert completion.job_id not in self.done, f"two completions for {completion.job_id}"
        self.done[completion.job_id] = completion


def _gone(pid: int) -> bool:
    """Dead, and reaped if it was this process's child (an adopted one that nobody reaps stays a zombie)."""
    return not alive(pid) and pid not in children(os.getpid())


def _read_pids(path: Path) -> dict[str, Any] | None:
    try:
        pids: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return pids


def _scenario(tmp_path: Path, bystander: subprocess.Popen[bytes], how: str) -> Completion:
    """Run an ``escape`` job that ends as ``how`` says (returns, times out, is cancelled); check that
    its escaped processes are gone and that nothing else is; returns its completion."""
    pid_path = tmp_path / "pids"
    escaped: list[int] = []
    out: dict[str, Completion] = {}

    async def body(b: Bundle) -> None:
        await until(lambda: b.pool.idle == 2, 30, "two idle runners")
        runners = set(b.pool.pids())
        neighbour = await asyncio.create_subprocess_exec("sleep", "300")  # started while the pool runs, in our session
        try:
            seconds, deadline = (0, None) if how == "returns" else (300, time.time() + 300)
            if how == "times_out":
                deadline = time.time() + 4.0  # time enough to start both and write their pids
            payload = json.dumps({"pid_path": str(pid_path), "seconds": seconds})
            assert b.pool.submit(JobSpec("escape", 1, "escape", payload, 1, deadline, timeout_sec=300))
            await until(lambda: _read_pids(pid_path), 30, "the job to write the escaped pids")
            pids = _read_pids(pid_path)
            assert pids is not None
            escaped.extend((pids["setsid"], pids["daemon"]))
            # Given processes of the job that left its runner's process group and session
            assert all(pids["runner"] not in ids for ids in pids["groups"]), pids
            if how == "cancelled":
                assert b.pool.kill("escape", 1, Outcome.CANCELLED)
            # When the job ends: then they are gone within a few seconds
            await until(lambda: "escape" in b.done, 30, "the job's completion")
            await until(lambda: all(_gone(pid) for pid in escaped), WITHIN, f"the escaped processes {escaped} to end")
            out["done"] = b.done["escape"]
            # and the runner that ran it is replaced; the pool's other runner and our own children stay
            await until(lambda: not alive(pids["runner"]), WITHIN, "the job's runner to be gone")
            await until(lambda: b.pool.idle == 2, 30, "the pool back to two idle runners")
            [other] = runners - {pids["runner"]}
            assert alive(other) and other in b.pool.pids()
            assert alive(neighbour.pid) and alive(bystander.pid)
            # and the next job runs
            after = JobSpec("after", 1, "spawn_python", "{}", 1, None)
            assert b.pool.submit(after)
            await until(lambda: "after" in b.done, 30, "the next job")
            assert b.done["after"].outcome is Outcome.SUCCEEDED, b.done["after"].error_message
        finally:
            neighbour.kill()
            await neighbour.wait()

    try:
        with_pool(Bundle, body)
    finally:
        for pid in escaped:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    assert alive(bystander.pid), "the pool ended a process that was not its own"
    return out["done"]


def test_processes_that_left_the_group_end_when_the_job_returns(
    tmp_path: Path, bystander: subprocess.Popen[bytes]
) -> None:
    done = _scenario(tmp_path, bystander, "returns")
    assert done.outcome is Outcome.SUCCEEDED, done.error_message
    result: dict[str, Any] = json.loads(done.result_json)
    assert set(result) == {"runner", "setsid", "daemon", "groups"}


def test_processes_that_left_the_group_end_at_the_job_s_timeout(
    tmp_path: Path, bystander: subprocess.Popen[bytes]
) -> None:
    done = _scenario(tmp_path, bystander, "times_out")
    assert (done.outcome, done.error_code) == (Outcome.TIMEOUT, "TIMEOUT"), done.error_message


def test_processes_that_left_the_group_end_when_the_job_is_cancelled(
    tmp_path: Path, bystander: subprocess.Popen[bytes]
) -> None:
    done = _scenario(tmp_path, bystander, "cancelled")
    assert (done.outcome, done.error_code) == (Outcome.CANCELLED, "CANCELLED"), done.error_message


def test_a_stray_the_worker_may_not_signal_costs_no_completion_and_no_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A process of another user's (a set-uid program a job ran, under a worker that is not root) cannot
    # be signalled; the tests run as root, which may signal anything, so os.kill refuses it here instead.
    refused: set[int] = set()
    real_kill = os.kill

    def kill(pid: int, sig: int) -> None:
        if pid in refused and sig == signal.SIGKILL:
            raise PermissionError(1, "Operation not permitted")
        real_kill(pid, sig)

    monkeypatch.setattr(os, "kill", kill)
    pid_path = tmp_path / "pids"
    escaped: list[int] = []

    async def body(b: Bundle) -> None:
        await until(lambda: b.pool.idle == 2, 30, "two idle runners")
        # Given a job whose setsid child the worker may not kill, stopped at its timeout
        payload = json.dumps({"pid_path": str(pid_path), "seconds": 300})
        assert b.pool.submit(JobSpec("escape", 1, "escape", payload, 1, time.time() + 4.0, timeout_sec=300))
        await until(lambda: _read_pids(pid_path), 30, "the job to write the escaped pids")
        pids = _read_pids(pid_path)
        assert pids is not None
        escaped.extend((pids["setsid"], pids["daemon"]))
        refused.add(pids["setsid"])
        # Then the job is reported and its runner replaced all the same (before: the sweep's PermissionError
        # escaped from the pool's exit handler: no completion, the slot lost, and stop() timed out)
        await until(lambda: "escape" in b.done, 30, "the job's completion")
        assert b.done["escape"].outcome is Outcome.TIMEOUT
        await until(lambda: b.pool.idle == 2, 30, "the pool back to two idle runners")
        assert b.pool.submit(JobSpec("after", 1, "spawn_python", "{}", 1, None))
        await until(lambda: "after" in b.done, 30, "the next job")
        assert b.done["after"].outcome is Outcome.SUCCEEDED, b.done["after"].error_message
        # and it says so; the others are ended, and the refused one is reaped once it exits by itself
        assert [r.pid for r in caplog.records if r.getMessage() == "stray_not_killed"] == [pids["setsid"]]  # type: ignore[attr-defined]
        await until(lambda: _gone(pids["daemon"]), WITHIN, "the daemon to end")
        assert alive(pids["setsid"])
        real_kill(pids["setsid"], signal.SIGKILL)
        await until(lambda: _gone(pids["setsid"]), WITHIN, "the refused stray to be reaped")

    try:
        with_pool(Bundle, body)
    finally:
        for pid in escaped:
            with contextlib.suppress(OSError):
                real_kill(pid, signal.SIGKILL)
