"""A job that raises JobFailed with a code or message that is not a string fails with it as text, and
its runner process lives on to run the next job. Before, writing the answer raised outside the job's
try, and the runner process died (the job ended CRASHED, and the slot waited for a new process)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.pools import OneSlotPool, with_pool
from worker.attempt import Completion, Outcome

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _importable_test_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def one_slot() -> OneSlotPool:
    return OneSlotPool(("tests.support.odd_failures",))


async def odd_failure(b: OneSlotPool, job_id: str, how: str) -> Completion:
    """Run an ``odd_failure`` job that ends as ``how`` says, with a 15 s timeout."""
    return await b.run(job_id, "odd_failure", {"how": how}, timeout_sec=15, within=20)


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
    async def body(b: OneSlotPool) -> None:
        # Given a runner process that ran a job
        before = json.loads((await odd_failure(b, "before", "ok")).result_json)["pid"]
        # When a job raises JobFailed with a code or a message that is not a string
        done = await odd_failure(b, "odd", how)
        # Then it fails with them as text
        assert (done.outcome, done.error_code, done.error_message) == (Outcome.FAILED, code, message)
        # And the same runner process runs the next job: it did not die
        after = await odd_failure(b, "after", "ok")
        assert after.outcome is Outcome.SUCCEEDED, after.error_message
        assert json.loads(after.result_json)["pid"] == before
        assert b.pool.restarts == 0

    with_pool(one_slot, body)
