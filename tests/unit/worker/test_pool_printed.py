"""RunnerPool and live output: what a running attempt prints reaches ``on_printed`` before its
completion, and does not keep it from being stopped at its deadline. Real runner processes."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tests.support.pools import with_pool
from tests.support.waiting import until
from worker.attempt import Completion, JobSpec, Outcome
from worker.pool import PoolConfig, RunnerPool

ROOT = Path(__file__).resolve().parents[3]
GRACE = 0.025
BOUND = 0.050  # as in test_pool: a killed job's process is gone within this long after deadline + grace


@pytest.fixture(autouse=True)
def _importable_test_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


class Bundle:
    """A pool that catches output, and what it reported, in the order it did."""

    def __init__(self) -> None:
        self.order: list[tuple[str, str]] = []
        """("printed" or "result", job_id), in the order the pool called back."""
        self.chunks: dict[str, list[tuple[float, int, int, str]]] = {}
        """job_id -> (when, attempt, offset, text) of each call of on_printed."""
        self.done: dict[str, tuple[float, Completion]] = {}
        config = PoolConfig(slots=2, imports=("tests.support.jobtypes",), kill_grace_sec=GRACE, output_bytes=4096)
        self.pool = RunnerPool(config, self._on_result, on_printed=self._on_printed)

    def _on_printed(self, job_id: str, attempt: int, offset: int, text: str) -> None:
        self.order.append(("printed", job_id))
        self.chunks.setdefault(job_id, []).append((time.time(), attempt, offset, text))

    def _on_result(self, completion: Completion) -> None:
        self.order.append(("result", completion.job_id))
        self.done[completion.job_id] = (time.time(), completion)

    def submit(self, job_id: str, payload: object, timeout: float | None = None) -> JobSpec:
        deadline = time.time() + timeout if timeout is not None else None
        spec = JobSpec(job_id, 1, "chatty", json.dumps(payload), 1, deadline)
        assert self.pool.submit(spec)
        return spec

    async def result(self, job_id: str, within: float = 10.0) -> tuple[float, Completion]:
        """When the completion of ``job_id`` came, and it."""
        await until(lambda: job_id in self.done, within, f"a completion of {job_id}")
        return self.done[job_id]

    def printed(self, job_id: str) -> list[tuple[float, int, str]]:
        """(when, offset, text) of what ``job_id`` printed, each named with its attempt (1)."""
        chunks = self.chunks.get(job_id, [])
        assert all(attempt == 1 for _, attempt, _, _ in chunks)
        return [(when, offset, text) for when, _, offset, text in chunks]


def scenario(body: Callable[[Bundle], Awaitable[None]]) -> None:
    with_pool(Bundle, body)


def test_what_an_attempt_prints_comes_live_and_before_its_completion():
    async def body(b: Bundle) -> None:
        # Given a job that prints a line every 0.3 s, and a quiet one beside it
        b.submit("chatty", {"lines": 3, "every": 0.3})
        b.submit("quiet", {"lines": 0})
        finished, done = await b.result("chatty")
        # Then its lines came with its job id and attempt, in order, the first well before it ended
        printed = b.printed("chatty")
        assert "".join(text for _, _, text in printed) == "out 1\nout 2\nout 3\n"
        ends = [0]
        for _, offset, text in printed:
            assert offset == ends[-1]  # contiguous: printed slowly, nothing was left out
            ends.append(offset + len(text))
        assert finished - printed[0][0] > 0.3
        # And all of it before the completion, which carries the whole
        mine = [kind for kind, job_id in b.order if job_id == "chatty"]
        assert mine == ["printed"] * len(printed) + ["result"]
        assert (done.outcome, done.output) == (Outcome.SUCCEEDED, "out 1\nout 2\nout 3\n")
        assert (await b.result("quiet"))[1].output == "" and b.printed("quiet") == []

    scenario(body)


@pytest.mark.serial  # times a bound in milliseconds: beside other tests it would time their load
def test_an_attempt_that_prints_is_still_stopped_at_its_deadline():
    async def body(b: Bundle) -> None:
        # Given a job that prints every 0.1 s for 10 s, with a 0.5 s deadline
        spec = b.submit("talker", {"lines": 100, "every": 0.1}, timeout=0.5)
        arrived, done = await b.result("talker")
        # Then it is reported TIMEOUT within the usual bound: its output did not put off the kill
        assert (done.outcome, done.error_code) == (Outcome.TIMEOUT, "TIMEOUT")
        assert spec.deadline is not None
        assert spec.deadline <= arrived < spec.deadline + GRACE + BOUND
        # And what it printed before came live, none of it after its completion
        printed = b.printed("talker")
        assert printed and printed[0][2].startswith("out 1\n") and printed[-1][0] <= arrived
        assert b.order[-1] == ("result", "talker")

    scenario(body)
