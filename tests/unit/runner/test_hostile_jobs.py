"""A job that misbehaves fails itself only: a clear end, and the jobs after it on the same runner run
as if it had never run.

Each case runs in a real one-slot RunnerPool (real runner processes, real pipes and signals, with the
job types of :mod:`tests.support.hostile_jobtypes`): a ``probe`` job, then the hostile one, then
the probe again, which must succeed with the same view of its process (working directory, umask,
environment, ``sys.path``, signal handlers, pending alarm, descriptor limit, ``sys.stdout``) and the
right answer for its payload. After each case the pool is back to one idle process and nothing the
runners started is left. Waits are on conditions with deadlines, never sleeps.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

import worker.pool
from tests.support.pools import with_pool
from tests.support.waiting import until
from worker.attempt import Completion, JobSpec, Outcome
from worker.pool import PoolConfig, RunnerPool

ROOT = Path(__file__).resolve().parents[3]
PLUGINS = ("tests.support.hostile_jobtypes",)
MEMORY_MB = 300
"""CORRAL_JOB_MEMORY_LIMIT_MB of the pools here: a job that eats memory stops there."""
DEADLINE = 15.0
"""The hostile job's timeout, unless the case sets one: none of them should come near it."""


@pytest.fixture(autouse=True)
def _importable_test_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setattr(worker.pool, "RETIRE_GRACE_SEC", 0.5)


def _group_members(groups: set[int]) -> list[int]:
    """Live processes in any of the process groups ``groups`` (a runner's pid names its group)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] not in ("Z", "X") and int(fields[2]) in groups:
            found.append(int(entry))
    return found


class Bundle:
    """A one-slot pool and the completions it reported; remembers every runner pid it saw."""

    def __init__(self, output_bytes: int) -> None:
        self.done: dict[str, Completion] = {}
        self.runners: set[int] = set()
        config = PoolConfig(
            slots=1, imports=PLUGINS, kill_grace_sec=0.025, output_bytes=output_bytes, memory_limit_mb=MEMORY_MB
        )
        self.pool = RunnerPool(config, self._on_result)

    def _on_result(self, completion: Completion) -> None:
        assert completion.job_id not in self.done, f"two completions for {completion.job_id}"
        self.done[completion.job_id] = completion

    def _seen(self) -> bool:
        self.runners.update(self.pool.pids())
        return True

    async def run(self, job_id: str, type_: str, payload: dict[str, Any], within: float = DEADLINE) -> Completion:
        self._seen()
        spec = JobSpec(job_id, 1, type_, json.dumps(payload), 1, time.time() + within, timeout_sec=within)
        assert self.pool.submit(spec)
        await until(lambda: self._seen() and job_id in self.done, within + 10, f"a completion of {job_id}")
        return self.done[job_id]

    async def probe(self, job_id: str) -> dict[str, Any]:
        """Run a probe; it must succeed and add its payload right. Its view of the process, pid left out."""
        done = await self.run(job_id, "probe", {"a": 2, "b": 3})
        assert done.outcome is Outcome.SUCCEEDED, (done.error_code, done.error_message)
        view: dict[str, Any] = json.loads(done.result_json)
        assert view.pop("sum") == 5
        if self.pool.config.output_bytes:
            assert done.output == "probe\n", done.output
        # It ran in a runner of the pool, not in a copy of one that a job forked.
        assert view.pop("pid") in self.runners, "the probe ran outside the pool's runners"
        return view


def _case(how: str, arg: object = None, output_bytes: int = 4096, timeout: float = DEADLINE) -> Completion:
    """Probe, run the hostile job ``how``, probe again (same view), check the pool and leftovers;
    returns the hostile job's completion."""
    out: dict[str, Completion] = {}
    runners: set[int] = set()

    async def body(b: Bundle) -> None:
        before = await b.probe("before")
        payload: dict[str, Any] = {"how": how}
        if arg is not None:
            payload["arg"] = arg
        out["hostile"] = await b.run("hostile", "hostile", payload, timeout)
        after = await b.probe("after")
        assert after == before, f"the probe after {how!r} saw {after}, before it {before}"
        await until(
            lambda: b._seen() and b.pool.idle == 1 and len(b.pool.pids()) == 1 and b.pool.busy == 0,
            10,
            "the pool back to one idle runner",
        )
        assert set(b.done) == {"before", "hostile", "after"}
        runners.update(b.runners)

    bundle: list[Bundle] = []

    def make() -> Bundle:
        bundle.append(Bundle(output_bytes))
        return bundle[0]

    try:
        with_pool(make, body)
        runners.update(bundle[0].runners)
        # Nothing a runner or its jobs started outlives the pool (the groups are the runners' pids).
        left: list[int] = []
        deadline = time.monotonic() + 10
        while (left := _group_members(runners)) and time.monotonic() < deadline:
            time.sleep(0.01)  # a synchronous check after the loop ended: nothing else to await
        assert not left, f"processes left after {how!r}: {left}"
    finally:
        for pid in _group_members(runners):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    return out["hostile"]


# -- what was fixed --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("how", "arg", "output_bytes"),
    [
        ("chdir", "/tmp", 4096),
        ("umask", None, 4096),
        ("environ", None, 4096),
        ("sys_path", None, 4096),
        ("sigterm_ignore", None, 4096),
        ("alarm", 2, 4096),  # would end the runner under a later job
        ("sigalrm_handler", 0.5, 4096),  # would raise inside a later job
        ("nofile_soft", 12, 4096),
        ("nofile", 12, 4096),  # a lowered hard limit: put back if privileged, else a fresh runner
        ("nproc", None, 4096),
        ("stdout_broken", None, 0),  # sys.stdout left broken where prints are not caught
        ("stdout_none", None, 0),
        ("patch_json_loads", None, 4096),  # the next job would get another payload
        ("close_std", None, 4096),
        ("dup2_std", None, 4096),
    ],
)
def test_process_state_a_job_changed_is_put_back_for_the_next_job(how: str, arg: object, output_bytes: int) -> None:
    done = _case(how, arg, output_bytes)
    assert done.outcome is Outcome.SUCCEEDED, (done.error_code, done.error_message)


@pytest.mark.parametrize("how", ["close_in", "dup2_in", "close_out", "dup2_out", "close_pipes"])
def test_a_job_that_closes_or_dup2s_over_the_runners_pipe_numbers_keeps_its_answer(how: str) -> None:
    # The runner's pipes are where they were given (--in/--out), the numbers a job closes or dup2s over;
    # its answer still goes out, and the next job (already sent to that runner, before) still runs.
    started = time.monotonic()
    done = _case(how)
    assert done.outcome is Outcome.SUCCEEDED, (done.error_code, done.error_message)
    assert time.monotonic() - started < DEADLINE / 2, "waited for the deadline"


def test_a_job_that_closes_every_descriptor_fails_crashed_saying_so_and_the_next_runs() -> None:
    done = _case("closerange")
    assert (done.outcome, done.error_code) == (Outcome.FAILED, "CRASHED")
    assert "closed or replaced its pipes" in done.error_message, done.error_message


@pytest.mark.parametrize("garbage", ["garbage!\n", "hello\n", "\x07\x00\x00\x00"])
def test_garbage_written_to_the_runners_pipe_fails_the_job_at_once_not_at_its_deadline(garbage: str) -> None:
    started = time.monotonic()
    done = _case("garbage_pipe", garbage)
    assert (done.outcome, done.error_code) == (Outcome.FAILED, "CRASHED"), done.error_message
    assert "on its answer pipe" in done.error_message, done.error_message
    assert time.monotonic() - started < DEADLINE / 2, "waited for the deadline"


@pytest.mark.parametrize("how", ["fork_child_returns", "fork_child_sys_exit"])
def test_a_forked_child_that_returns_into_the_runner_neither_answers_nor_takes_the_next_job(how: str) -> None:
    # The parent's answer (its own pid) is the job's; the probe after it runs in the runner itself.
    done = _case(how)
    assert done.outcome is Outcome.SUCCEEDED, (done.error_code, done.error_message)
    assert json.loads(done.result_json)["pid"] > 0


# -- what held -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("how", "arg", "outcome", "code", "says"),
    [
        ("exit0", None, Outcome.FAILED, "CRASHED", "exit status 0"),
        ("exit3", None, Outcome.FAILED, "CRASHED", "exit status 3"),
        ("segfault", None, Outcome.FAILED, "CRASHED", "SIGSEGV"),
        ("sys_exit", 5, Outcome.FAILED, "ERROR", "SystemExit: 5"),
        ("keyboard_interrupt", None, Outcome.FAILED, "ERROR", "KeyboardInterrupt"),
        ("base_exception", None, Outcome.FAILED, "ERROR", "_Custom: custom"),
        ("recursion_error", None, Outcome.FAILED, "ERROR", "RecursionError"),
        ("memory", None, Outcome.FAILED, "MEMORY_LIMIT", f"the limit is {MEMORY_MB} MiB"),
        ("memory_caught", None, Outcome.SUCCEEDED, "", ""),
        ("thread_forever", True, Outcome.SUCCEEDED, "", ""),
        ("thread_forever", False, Outcome.SUCCEEDED, "", ""),
        ("daemon_child", None, Outcome.SUCCEEDED, "", ""),
        ("fork_exit_child", None, Outcome.SUCCEEDED, "", ""),
        ("fork_bomb", 20, Outcome.SUCCEEDED, "", ""),
        ("garbage_std", None, Outcome.SUCCEEDED, "", ""),
        ("stdout_none", None, Outcome.SUCCEEDED, "", ""),
        ("patch_encoder", None, Outcome.SUCCEEDED, "", ""),
        ("print_huge", 100, Outcome.SUCCEEDED, "", ""),
    ],
)
def test_a_hostile_job_ends_clearly_and_the_next_job_runs(
    how: str, arg: object, outcome: Outcome, code: str, says: str
) -> None:
    done = _case(how, arg)
    assert (done.outcome, done.error_code) == (outcome, code), done.error_message
    assert says in done.error_message


@pytest.mark.parametrize(
    ("kind", "code", "says"),
    [
        ("object", "ERROR", "not JSON serializable"),
        ("set", "ERROR", "not JSON serializable"),
        ("tuple_key", "ERROR", "keys must be str"),
        ("nan", "ERROR", "Out of range float values"),
        ("recursive", "ERROR", "deeper than"),
        ("deep", "ERROR", "deeper than"),
        ("huge", "RESULT_TOO_LARGE", "over the limit"),
    ],
)
def test_a_result_that_is_not_json_fails_its_job_only(kind: str, code: str, says: str) -> None:
    done = _case("result", kind)
    assert (done.outcome, done.error_code) == (Outcome.FAILED, code)
    assert says in done.error_message, done.error_message


def test_a_job_that_ignores_sigterm_past_its_timeout_is_killed_and_the_next_runs() -> None:
    done = _case("ignore_term_sleep", 60, timeout=1.0)
    assert (done.outcome, done.error_code) == (Outcome.TIMEOUT, "TIMEOUT")
    assert "SIGKILL" in done.error_message, done.error_message
