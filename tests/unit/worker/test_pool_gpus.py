"""GPU devices in the RunnerPool: which devices an attempt gets, what its job sees, when they come back.

Real runner processes, real pipes; no GPU is needed: the devices are ids the pool hands out and the
job sees them in ``CUDA_VISIBLE_DEVICES`` (the ``visible_devices`` probe reports it, and its pid).
Tests wait on conditions with deadlines, never on sleeps.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from corral.logs import GPUS_UNAVAILABLE
from tests.support.pools import with_pool
from tests.support.processes import alive
from tests.support.waiting import until
from worker.attempt import Completion, JobSpec, Outcome
from worker.pool import PoolConfig, RunnerPool

ROOT = Path(__file__).resolve().parents[3]
PROBE = "tests.unit.runner.devices_probe"
PLUGINS = (PROBE, "tests.support.jobtypes")


@pytest.fixture(autouse=True)
def _importable_test_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    # Runner processes import the probe; make the repository root importable for them.
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


class GpuBundle:
    """A started pool, its completions, and the free devices and live pid at each completion."""

    def __init__(self, slots: int, gpus: tuple[str, ...], imports: tuple[str, ...] = PLUGINS) -> None:
        self.done: dict[str, Completion] = {}
        self.free_at_completion: dict[str, tuple[str, ...]] = {}
        self.pool = RunnerPool(
            PoolConfig(slots=slots, imports=imports, kill_grace_sec=0.01, gpus=gpus), self._on_result
        )

    def _on_result(self, completion: Completion) -> None:
        assert completion.job_id not in self.done, f"two completions for {completion.job_id}"
        self.done[completion.job_id] = completion
        self.free_at_completion[completion.job_id] = self.pool.free_gpus

    def submit(self, job_id: str, gpus: int = 0, type_: str = "visible_devices", **payload: Any) -> None:
        assert self.pool.submit(JobSpec(job_id, 1, type_, json.dumps(payload), 1, None, gpus))

    async def completion(self, job_id: str, within: float = 15.0) -> Completion:
        await until(lambda: job_id in self.done, within, f"a completion of {job_id}")
        return self.done[job_id]

    async def result(self, job_id: str) -> dict[str, Any]:
        """The job's result (it must have succeeded)."""
        done = await self.completion(job_id)
        assert done.outcome is Outcome.SUCCEEDED, (done.error_code, done.error_message)
        out: dict[str, Any] = json.loads(done.result_json)
        return out

    def free(self) -> tuple[str, ...]:
        """The pool's free devices now (a call, so that each check reads them afresh)."""
        return self.pool.free_gpus

    async def full(self) -> None:
        """Wait until the pool is back to ``slots`` ready, idle processes."""
        slots = self.pool.config.slots
        await until(lambda: self.pool.idle == slots and len(self.pool.pids()) == slots, what="a full idle pool")


def scenario(
    slots: int, gpus: tuple[str, ...], body: Callable[[GpuBundle], Awaitable[None]], imports: tuple[str, ...] = PLUGINS
) -> None:
    with_pool(lambda: GpuBundle(slots, gpus, imports), body)


def test_two_attempts_at_once_get_different_devices_which_come_back_when_they_end(tmp_path: Path) -> None:
    gate = tmp_path / "gate"

    async def body(b: GpuBundle) -> None:
        # Given a worker with two GPUs, when two 1-GPU attempts run at once
        b.submit("a", gpus=1, gate=str(gate))
        b.submit("b", gpus=1, gate=str(gate))
        await until(lambda: b.pool.busy == 2, what="both attempts running")
        # Then they hold both devices between them
        assert b.free() == ()
        gate.touch()
        seen = {job: (await b.result(job))["devices"] for job in ("a", "b")}
        # And each job saw its own device only
        assert sorted(seen.values()) == ["0", "1"]
        # And each device was free again before its attempt's completion went out
        assert all(seen[job] in b.free_at_completion[job] for job in ("a", "b"))
        assert b.free() == ("0", "1")

    scenario(2, ("0", "1"), body)


def test_the_lowest_listed_free_devices_go_first_in_their_listed_order(tmp_path: Path) -> None:
    gate = tmp_path / "gate"

    async def body(b: GpuBundle) -> None:
        # Given devices listed out of order, one of them held
        b.submit("one", gpus=1, gate=str(gate))
        await until(lambda: b.pool.busy == 1)
        assert b.free() == ("GPU-b", "3")
        # When a job asks for the two others, it gets them in the listed order
        b.submit("two", gpus=2)
        assert (await b.result("two"))["devices"] == "GPU-b,3"
        gate.touch()
        assert (await b.result("one"))["devices"] == "7"
        assert b.free() == ("7", "GPU-b", "3")

    scenario(2, ("7", "GPU-b", "3"), body)


def test_a_job_without_gpus_on_a_gpu_worker_sees_no_device_and_keeps_its_process() -> None:
    async def body(b: GpuBundle) -> None:
        # Given a worker with GPUs, when two jobs without GPUs run one after the other
        b.submit("first")
        first = await b.result("first")
        b.submit("second")
        second = await b.result("second")
        # Then each saw an empty list (no device visible), and jobs without GPUs share a process as before
        assert (first["devices"], second["devices"]) == ("", "")
        assert first["pid"] == second["pid"]
        assert b.pool.restarts == 0

    scenario(1, ("0", "1"), body)


def test_a_worker_without_gpus_leaves_the_variable_as_the_runner_inherited_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given runners that inherit CUDA_VISIBLE_DEVICES=5 from a worker configured with no GPUs
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")

    async def body(b: GpuBundle) -> None:
        b.submit("plain")
        # Then the job sees what the runner inherited
        assert (await b.result("plain"))["devices"] == "5"
        # And a job that asks for a GPU is handed back: there is none here
        b.submit("wants-gpu", gpus=1)
        handed = await b.completion("wants-gpu")
        assert (handed.outcome, handed.error_code) == (Outcome.HANDED_BACK, "HANDED_BACK")
        assert b.pool.restarts == 0

    scenario(1, (), body)


def test_the_runner_that_ran_a_gpu_job_is_replaced_before_the_completion_goes_out() -> None:
    async def body(b: GpuBundle) -> None:
        await b.full()
        # Given a job holding a GPU
        b.submit("gpu", gpus=1)
        gpu = await b.result("gpu")
        assert gpu["devices"] == "0"
        # Then its runner process was gone by the time its completion was reported
        assert not alive(gpu["pid"])
        assert b.free_at_completion["gpu"] == ("0",)
        # And the next job runs in a fresh process, which sees no device
        await b.full()
        b.submit("next")
        after = await b.result("next")
        assert after["pid"] != gpu["pid"]
        assert after["devices"] == ""
        assert b.pool.restarts == 1

    scenario(1, ("0",), body)


def test_a_gpu_job_prefers_a_process_in_which_no_job_ran() -> None:
    async def body(b: GpuBundle) -> None:
        await b.full()
        # Given one of two processes used by a job without GPUs (the one the next job would get)
        b.submit("plain")
        used = (await b.result("plain"))["pid"]
        # When a GPU job comes, it goes to the other one, which no job touched
        b.submit("gpu", gpus=1)
        assert (await b.result("gpu"))["pid"] != used

    scenario(2, ("0",), body)


def test_a_gpu_job_never_runs_in_a_process_where_another_job_ran() -> None:
    async def body(b: GpuBundle) -> None:
        await b.full()
        # Given the only process used by a job without GPUs (CUDA started there would see no device)
        b.submit("plain")
        used = (await b.result("plain"))["pid"]
        # When a GPU job comes, that process is replaced first and the job runs in its replacement
        b.submit("gpu", gpus=1)
        gpu = await b.result("gpu")
        assert (gpu["pid"] != used, gpu["devices"]) == (True, "0")
        assert not alive(used)
        # And jobs queued behind it still run
        b.submit("after")
        assert (await b.result("after"))["devices"] == ""

    scenario(1, ("0",), body)


def test_too_few_free_devices_hand_the_attempt_back_naming_the_job(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gate = tmp_path / "gate"

    async def body(b: GpuBundle) -> None:
        # Given the only GPU held
        b.submit("holder", gpus=1, gate=str(gate))
        await until(lambda: b.pool.busy == 1)
        # When another 1-GPU attempt arrives (a race the control plane's count should prevent)
        with caplog.at_level(logging.WARNING, logger="worker.pool"):
            b.submit("late", gpus=1)
        # Then it is handed back at once, without running, and a warning names it
        late = await b.completion("late")
        assert (late.outcome, late.error_code) == (Outcome.HANDED_BACK, "HANDED_BACK")
        assert "1 GPUs" in late.error_message
        warned = [r for r in caplog.records if r.getMessage() == GPUS_UNAVAILABLE]
        assert [getattr(r, "job_id", None) for r in warned] == ["late"]
        assert not b.pool.holds("late", 1)
        # And the holder still runs with its device
        assert b.free() == ()
        gate.touch()
        assert (await b.result("holder"))["devices"] == "0"

    scenario(2, ("0",), body)


@pytest.mark.parametrize("how", ["cancel", "crash"])
def test_devices_come_back_when_the_process_is_killed_or_dies(how: str, tmp_path: Path) -> None:
    gate = tmp_path / "gate"

    async def body(b: GpuBundle) -> None:
        if how == "cancel":
            b.submit("job", gpus=2, gate=str(gate))
            await until(lambda: b.pool.busy == 1)
            assert b.free() == ()
            assert b.pool.kill("job", 1, Outcome.CANCELLED)
            expected = (Outcome.CANCELLED, "CANCELLED")
        else:
            b.submit("job", gpus=2, type_="crash", how="exit")
            expected = (Outcome.FAILED, "CRASHED")
        done = await b.completion("job")
        assert (done.outcome, done.error_code) == expected
        assert b.free_at_completion["job"] == ("0", "1")
        await b.full()
        b.submit("again", gpus=2)
        assert (await b.result("again"))["devices"] == "0,1"

    scenario(1, ("0", "1"), body)


def test_a_command_job_gets_the_same_devices_and_its_env_cannot_change_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CORRAL_COMMAND_ALLOW", "/usr/bin/env")

    def seen(done: Completion) -> list[str]:
        assert done.outcome is Outcome.SUCCEEDED, (done.error_code, done.error_message)
        out = json.loads(done.result_json)["stdout"]
        return [line for line in out.splitlines() if line.startswith("CUDA_VISIBLE_DEVICES=")]

    async def body(b: GpuBundle) -> None:
        # Given a worker with two GPUs that allows command jobs to run /usr/bin/env
        b.submit("env-gpu", gpus=1, type_="command", argv=["/usr/bin/env"])
        b.submit("env-none", type_="command", argv=["/usr/bin/env"], env={"CUDA_VISIBLE_DEVICES": "0,1"})
        # Then the program of a 1-GPU job sees its device, and one without GPUs sees none, whatever its env said
        assert seen(await b.completion("env-gpu")) in (["CUDA_VISIBLE_DEVICES=0"], ["CUDA_VISIBLE_DEVICES=1"])
        assert seen(await b.completion("env-none")) == ["CUDA_VISIBLE_DEVICES="]

    scenario(2, ("0", "1"), body, imports=(PROBE, "runner.extra.command"))
