"""``python -m runner.serve`` and the devices of a request: a real runner process over its two pipes.

The frames are those the worker's pool sends (:mod:`runner.wire`); the ``visible_devices`` probe says
what ``CUDA_VISIBLE_DEVICES`` each job saw.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from runner.wire import FAILED, LAST, OK, encode_request
from tests.support.runner_pipes import WITHIN, RunnerPipes, start_runner


def _run(runner: RunnerPipes, devices: bytes | None) -> tuple[int, dict[str, Any]]:
    """Send one ``visible_devices`` job; its answer's flags and result."""
    os.write(runner.requests, encode_request(b"job", b"visible_devices", b"{}", 1, 1, 0.0, devices))
    kind, flags, code, body = runner.frame()
    assert kind == OK, (kind, code, body)
    result: dict[str, Any] = json.loads(body)
    return flags, result


@pytest.fixture
def runner() -> Iterator[RunnerPipes]:
    """A runner process started as the pool starts one, whose own CUDA_VISIBLE_DEVICES is ``own``."""
    r = start_runner("--import", "tests.unit.runner.devices_probe", env={"CUDA_VISIBLE_DEVICES": "own"})
    try:
        yield r
    finally:
        r.close()


def test_a_job_sees_its_devices_and_the_runner_s_own_value_comes_back_after(runner: RunnerPipes) -> None:
    # Given a runner whose own CUDA_VISIBLE_DEVICES is "own"
    # When the request leaves the variable alone (a worker without GPUs), the job sees the runner's own
    assert _run(runner, None) == (0, {"devices": "own", "pid": runner.proc.pid})
    # When it says "no device" (a job without GPUs on a GPU worker), the job sees an empty list
    assert _run(runner, b"") == (0, {"devices": "", "pid": runner.proc.pid})
    # And the next job that leaves it alone sees the runner's own value again: it was put back
    assert _run(runner, None)[1]["devices"] == "own"


def test_the_answer_to_a_job_that_held_gpus_is_the_runner_s_last(runner: RunnerPipes) -> None:
    # Given a job holding two devices
    flags, result = _run(runner, b"2,GPU-x")
    # Then it saw them, and the runner flagged its answer LAST and exits: CUDA would keep those devices
    assert result["devices"] == "2,GPU-x"
    assert flags & LAST
    assert runner.proc.wait(WITHIN) == 0


def test_a_failed_job_that_held_gpus_is_the_runner_s_last_too(runner: RunnerPipes) -> None:
    os.write(runner.requests, encode_request(b"job", b"visible_devices", b"[]", 1, 1, 0.0, b"0"))
    kind, flags, code, _ = runner.frame()
    assert (kind, code) == (FAILED, b"INVALID_PAYLOAD")
    assert flags & LAST
    assert runner.proc.wait(WITHIN) == 0
