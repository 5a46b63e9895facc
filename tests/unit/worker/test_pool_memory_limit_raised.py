"""The per-job memory limit holds against a job that raises its own limit, and leaves the runner and
the job's subprocesses working.

``raise_memory_limit`` (:mod:`tests.support.escaping_jobtypes`) sets its soft ``RLIMIT_AS`` to the hard
limit, as far as an unprivileged process may, then allocates far past ``CORRAL_JOB_MEMORY_LIMIT_MB``.
Real runner processes in a real RunnerPool; waits are on conditions with deadlines, never sleeps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.pools import OneSlotPool, with_pool
from tests.support.processes import alive
from tests.support.waiting import until
from worker.attempt import Outcome

ROOT = Path(__file__).resolve().parents[3]
PLUGINS = ("tests.support.escaping_jobtypes",)
LIMIT_MB = 64
PAST_MB = 1024
"""What the job allocates: sixteen times its limit (untouched pages, so no real memory is used)."""


@pytest.fixture(autouse=True)
def _importable_test_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def one_slot() -> OneSlotPool:
    """A one-slot pool whose jobs may allocate LIMIT_MB MiB."""
    return OneSlotPool(PLUGINS, memory_limit_mb=LIMIT_MB)


def test_a_job_that_raises_its_soft_limit_still_fails_memory_limit_and_the_next_job_runs() -> None:
    async def body(b: OneSlotPool) -> None:
        # Given a runner whose jobs may allocate LIMIT_MB MiB, and a job that first raises its soft limit
        # as far as it can, then allocates PAST_MB MiB
        done = await b.run("greedy", "raise_memory_limit", {"mib": PAST_MB})
        # Then it fails with MEMORY_LIMIT (before: the raise reached the hard limit, and it succeeded)
        assert (done.outcome, done.error_code) == (Outcome.FAILED, "MEMORY_LIMIT"), (
            done.result_json,
            done.error_message,
        )
        assert f"the limit is {LIMIT_MB} MiB" in done.error_message
        # and the next job runs in a fresh runner, whose subprocesses run under the same limit
        after = await b.run("after", "spawn_python", {})
        assert after.outcome is Outcome.SUCCEEDED, after.error_message
        assert json.loads(after.result_json)["printed"] == "42"
        assert b.pool.restarts == 1

    with_pool(one_slot, body)


def test_a_job_that_lowers_the_hard_limit_leaves_the_next_job_the_limit_it_had() -> None:
    async def body(b: OneSlotPool) -> None:
        before = json.loads((await b.run("before", "memory_limits", {})).result_json)
        assert before["soft"] == before["hard"] != -1, before
        # Given a job that lowers its runner's hard address-space limit (for good, unless privileged)
        done = await b.run("lower", "lower_memory_hard_limit", {})
        # Then it is answered as usual
        assert done.outcome is Outcome.SUCCEEDED, done.error_message
        # and the next job has the limit back: put back (a privileged runner), or a fresh runner's
        after = json.loads((await b.run("after", "memory_limits", {})).result_json)
        if after["pid"] == before["pid"]:
            assert after == before
        else:
            assert after["soft"] == after["hard"] != -1, after
            await until(lambda: not alive(before["pid"]), 10, "the runner to be replaced")

    with_pool(one_slot, body)


def test_the_limit_binds_hard_and_soft_alike() -> None:
    # In a process of its own: the hard limit lowered there stays lowered
    code = (
        "import resource\n"
        "from runner.limits import apply_memory_limit\n"
        "limit = apply_memory_limit(32)\n"
        "print(resource.getrlimit(resource.RLIMIT_AS) == (limit, limit))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["True"], done.stderr
