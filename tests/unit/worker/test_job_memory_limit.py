"""CORRAL_JOB_MEMORY_LIMIT_MB is a worker setting like the others: checked at start-up (exit 2, one line
naming the variable and the rule; ``--check-config`` says the same), never first found bad by every
runner process (exit 1, "does every --import module import?", restarted for ever by ``corral up``).

The address-space hard limit (``ulimit -v`` on HPC nodes) is set for real on the processes started
here, through ``sh -c 'ulimit -v ...'``, as a batch system would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import worker.config
from corral.limits import MAX_MEMORY_MB
from worker import Agent, WorkerConfig
from worker.config import ConfigError

ROOT = Path(__file__).resolve().parents[3]
HARD_MIB = 64 << 10
"""The hard limit the processes here run under: far above an idle worker or runner process (with one
OpenMP thread stack per CPU), so that only the setting can break it."""


def under_hard_limit(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with an RLIMIT_AS of HARD_MIB (soft and hard), and ``env`` over a clean environment."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    clean["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    return subprocess.run(
        ["sh", "-c", f'ulimit -v {HARD_MIB << 10} && exec "$@"', "sh", *argv],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_it_is_read_and_defaults_to_no_limit() -> None:
    assert WorkerConfig.from_env({}).job_memory_limit_mb == 0
    assert WorkerConfig.from_env({"CORRAL_JOB_MEMORY_LIMIT_MB": " 512 "}).job_memory_limit_mb == 512


def test_a_value_over_the_hard_limit_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker.config, "hard_limit_bytes", lambda: 4096 << 20)
    assert WorkerConfig.from_env({"CORRAL_JOB_MEMORY_LIMIT_MB": "4096"}).job_memory_limit_mb == 4096
    with pytest.raises(ConfigError) as error:
        WorkerConfig.from_env({"CORRAL_JOB_MEMORY_LIMIT_MB": "4097"})
    assert str(error.value) == (
        "CORRAL_JOB_MEMORY_LIMIT_MB must be at most the worker's address-space hard limit "
        "(RLIMIT_AS, ulimit -Hv) of 4096 MiB, got 4097"
    )
    # Unlimited, the bound of the rule holds alone
    monkeypatch.setattr(worker.config, "hard_limit_bytes", lambda: None)
    assert WorkerConfig(job_memory_limit_mb=MAX_MEMORY_MB).job_memory_limit_mb == MAX_MEMORY_MB


def test_the_agent_gives_its_runners_the_checked_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    # and its pool no longer reads the variable on its own (where a bad value could only fail it)
    monkeypatch.setenv("CORRAL_JOB_MEMORY_LIMIT_MB", "lots")
    assert Agent(WorkerConfig(job_memory_limit_mb=64)).pool.config.memory_limit_mb == 64
    assert Agent(WorkerConfig()).pool.config.memory_limit_mb == 0


BAD = [
    ("4G", "CORRAL_JOB_MEMORY_LIMIT_MB must be an integer number of MiB, got '4G'"),
    ("-1", f"CORRAL_JOB_MEMORY_LIMIT_MB must be 0 (no limit) to {MAX_MEMORY_MB} (MiB), got -1"),
    (
        str(MAX_MEMORY_MB + 1),
        f"CORRAL_JOB_MEMORY_LIMIT_MB must be 0 (no limit) to {MAX_MEMORY_MB} (MiB), got {MAX_MEMORY_MB + 1}",
    ),
    (
        str(HARD_MIB + 1),
        "CORRAL_JOB_MEMORY_LIMIT_MB must be at most the worker's address-space hard limit (RLIMIT_AS, "
        f"ulimit -Hv) of {HARD_MIB} MiB, got {HARD_MIB + 1}",
    ),
]


@pytest.mark.parametrize(("value", "message"), BAD, ids=["unit", "negative", "absurd", "over-ulimit"])
def test_a_bad_value_stops_the_worker_with_exit_2_and_one_line_and_fails_the_check(value: str, message: str) -> None:
    env = {"CORRAL_JOB_MEMORY_LIMIT_MB": value}
    # Before: --check-config said OK; a start failed in the runners, exit 1 with a JSON log line
    check = under_hard_limit([sys.executable, "-m", "worker", "--check-config"], env)
    assert (check.returncode, check.stderr.splitlines()) == (2, [f"configuration error: {message}"]), check.stderr
    start = under_hard_limit([sys.executable, "-m", "worker", "--threads", "1"], env)
    assert (start.returncode, start.stderr.splitlines()) == (2, [f"python -m worker: {message}"]), start.stderr


def test_a_limit_near_the_hard_limit_still_lets_the_runners_start() -> None:
    # An idle runner plus the setting is over the hard limit: the runner's limit is the hard limit
    # (which binds its jobs anyway), where setrlimit used to fail in every runner before it was ready
    code = textwrap.dedent(
        f"""
        import asyncio
        from worker.pool import PoolConfig, RunnerPool

        async def main() -> None:
            pool = RunnerPool(PoolConfig(slots=1, memory_limit_mb={HARD_MIB - 1}), lambda completion: None)
            await pool.start()
            print("ready", len(pool.pids()))
            await pool.stop()

        asyncio.run(main())
        """
    )
    done = under_hard_limit([sys.executable, "-c", code], {})
    assert (done.returncode, done.stdout.strip()) == (0, "ready 1"), done.stderr
