"""A job that raises JobFailed with a code or message that is not a string fails with it as text, and
its runner process lives on to run the next job. Before, writing the answer raised outside the job's
try, and the runner process died (the job ended CRASHED, and the slot waited for a new process)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

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
    """A one-slot pool with the odd_failure plug-in, and the completions it reported."""

    def __init__(self) -> None:
        self.done: dict[str, Completion] = {}
        self.pool = RunnerPool(PoolConfig(slots=1, imports=("tests.support.odd_failures",)), self._on_result)

    def _on_result(self, completion: Completion) -> None:
        self.done[completion.job_id] = completion

    async def run(self, job_id: str, how: str) -> Completion:
        spec = JobSpec(job_id, 1, "odd_failure", json.dumps({"how": how}), 1, time.time() + 15, timeout_sec=15)
        assert self.pool.submit(spec)
        await until(lambda: job_id in self.done, 20, f"a completion of {job_id}")
        return self.done[job_id]


@pytest.mark.parametrize(
    ("how", "code", "message"),
    [
        ("int_code", "123", "plain"),
        ("object_message", "ODD", "shown object"),
        ("unshowable", "ODD", "<_Unshowable that cannot be shown>"),
    ],
)
def test_a_jobfailed_with_a_code_or_message_that_is_not_text_fails_the_job_and_the_runner_lives(
    how: str, code: str, message: str
) -> None:
    async def body(b: Bundle) -> None:
        # Given a runner process that ran a job
        before = json.loads((await b.run("before", "ok")).result_json)["pid"]
        # When a job raises JobFailed with a code or a message that is not a string
        done = await b.run("odd", how)
        # Then it fails with them as text
        assert (done.outcome, done.error_code, done.error_message) == (Outcome.FAILED, code, message)
        # And the same runner process runs the next job: it did not die
        after = await b.run("after", "ok")
        assert after.outcome is Outcome.SUCCEEDED, after.error_message
        assert json.loads(after.result_json)["pid"] == before
        assert b.pool.restarts == 0

    with_pool(Bundle, body)
