"""``python -m worker`` as a process: configuration errors, SIGTERM drains, kill -9 leaves no orphans."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from corral.v1 import workers_pb2 as pb
from tests.conftest import wait_until
from tests.support.fake_control import job, worker_env, worker_with_fake_control
from tests.support.processes import alive, children
from tests.support.waiting import until

ROOT = Path(__file__).resolve().parents[3]
R = pb.JobResult


def test_a_bad_setting_exits_2_naming_the_variable():
    done = subprocess.run(
        [sys.executable, "-m", "worker", "--threads", "0"],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "CORRAL_WORKER_THREADS must be 1..1024" in done.stderr


@pytest.mark.parametrize(
    ("module", "said"),
    [
        ("tests.support.no_such_module", "No module named 'tests.support.no_such_module'"),
        ("tests.support.plugin_raising", "RuntimeError: this plug-in fails as it is imported"),
        # A schema the control plane refuses: before, the worker started, and had its registration
        # refused for ever (INVALID_ARGUMENT each time)
        (
            "tests.support.plugin_bad_pattern",
            "ValueError: BadPattern.schema: not a valid JSON Schema: '(unclosed' is not a 'regex' "
            "(at /properties/a/pattern)",
        ),
        (
            "tests.support.plugin_bad_minimum",
            "ValueError: BadMinimum.schema: not a valid JSON Schema: 'x' is not of type 'number' "
            "(at /properties/n/minimum)",
        ),
    ],
)
def test_a_plugin_that_does_not_import_exits_2_naming_it(module: str, said: str):
    # exit 2, like a bad setting: it would fail the same way on every restart (corral up stops on it)
    done = subprocess.run(
        [sys.executable, "-m", "worker", "--import", module, "--threads", "1"],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert f"python -m worker: cannot import job-type plug-in '{module}': {said}" in done.stderr
    assert "Traceback" not in done.stderr


def test_sigterm_while_the_runners_start_stops_the_worker_cleanly():
    # Given a worker whose plug-in is slow to import, stopped (a scale-down, Ctrl-C) while its runner
    # processes are still importing it
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker", "--import", "tests.support.plugin_slow", "--threads", "2"],
        cwd=ROOT,
        env={**worker_env(), "CORRAL_TEST_IMPORT_SEC": "3"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: len(children(proc.pid)) == 2, timeout=30, what="the runner processes to start")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    # Then it exits 0, saying it stopped (before: exit 3 and an error blaming the plug-ins, "a runner
    # process exited while starting (does every --import module import?)")
    assert proc.returncode == 0, err
    assert "worker_start_failed" not in out + err and "worker_stopped" in out + err


def test_sigterm_drains_then_exits_0():
    async def main() -> None:
        async with worker_with_fake_control("--drain-timeout", "5") as (control, proc):
            s = await control.session(within=30)
            assert (await s.next("register")).worker_id == "w-main"
            s.registered()
            s.assign(job("finishing", "sleep", {"seconds": 0.3}))
            await asyncio.sleep(0.05)  # not for synchronisation: lets the job start before the signal
            proc.send_signal(signal.SIGTERM)
            assert (await s.next("draining")).deadline_sec == 5.0
            s.assign(job("refused", "noop"))
            results = await s.results(2)
            assert results[("finishing", 1)].outcome == R.SUCCEEDED
            assert results[("refused", 1)].outcome == R.HANDED_BACK
            s.ack(("finishing", 1), ("refused", 1))
            async with asyncio.timeout(15):
                assert await proc.wait() == 0

    asyncio.run(main())


def test_kill_9_of_the_worker_leaves_no_runner_process():
    async def main() -> None:
        async with worker_with_fake_control() as (control, proc):
            s = await control.session(within=30)
            await s.next("register")
            s.registered()
            s.assign(job("long", "sleep", {"seconds": 60}))
            await until(lambda: children(proc.pid), what="runner processes")
            runners = children(proc.pid)
            assert len(runners) == 2
            proc.kill()
            await proc.wait()
            await until(lambda: not any(alive(p) for p in runners), within=5, what="no orphaned runner process")

    asyncio.run(main())


def test_kill_9_of_the_worker_ends_the_processes_its_runners_started(tmp_path: Path):
    # Given a worker running a job that waits on a child process of its own (a tool, a shell command),
    # with a plug-in that started a helper process as it was imported
    async def main() -> None:
        imports = ("--import", "tests.support.probes", "--import", "tests.support.plugin_helper")
        async with worker_with_fake_control(*imports) as (control, proc):
            s = await control.session(within=30)
            await s.next("register")
            s.registered()
            pid_file = tmp_path / "child"
            s.assign(job("tool", "pid_spawn", {"pid_path": str(pid_file), "seconds": 600}))
            await until(lambda: pid_file.exists(), what="the job's child to start")
            child = int(pid_file.read_text())
            s.assign(job("helper", "helper_pid"))
            helper = json.loads((await s.results(1))[("helper", 1)].result_json)["helper"]
            assert alive(child) and alive(helper)
            # When the worker is killed with SIGKILL (no chance to clean up)
            proc.kill()
            await proc.wait()
            # Then the job's child and the helper die with its runners, instead of running on orphaned
            await until(lambda: not (alive(child) or alive(helper)), within=5, what="the child and helper to die")

    asyncio.run(main())


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def test_plugin_code_runs_in_runner_processes_only_and_goes_with_the_worker():
    # Given a worker with a plug-in that starts a helper process as it is imported
    async def main() -> None:
        async with worker_with_fake_control("--import", "tests.support.plugin_helper", "--drain-timeout", "5") as (
            control,
            proc,
        ):
            s = await control.session(within=30)
            register = await s.next("register")
            # Then the worker registers the plug-in's type, learnt from its runners
            assert "helper_pid" in {t.name for t in register.job_types}
            s.registered()
            await until(lambda: len(children(proc.pid)) == 2, what="the runner processes")
            # and its own children are the runners alone: the plug-in's helper was not started in it
            runners = children(proc.pid)
            assert all(b"runner.serve" in _cmdline(pid) for pid in runners)
            helpers = [c for pid in runners for c in children(pid)]
            assert len(helpers) == 2 and all(alive(h) for h in helpers)
            # When the worker stops on SIGTERM
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(15):
                assert await proc.wait() == 0
            # Then the helpers went with its runners
            await until(lambda: not any(alive(h) for h in helpers), within=5, what="the helpers to end")

    asyncio.run(main())
