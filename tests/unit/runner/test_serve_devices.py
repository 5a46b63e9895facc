"""``python -m runner.serve`` and the devices of a request: a real runner process over its two pipes.

The frames are those the worker's pool sends (:mod:`runner.wire`); the ``visible_devices`` probe says
what ``CUDA_VISIBLE_DEVICES`` each job saw.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runner.wire import FAILED, LAST, OK, READY, RESPONSE, encode_request

ROOT = Path(__file__).resolve().parents[3]
WITHIN = 30.0


@dataclass
class Runner:
    """A runner process, the ends of its pipes the worker would hold, and a reader of its answers."""

    proc: subprocess.Popen[bytes]
    requests: int
    answers: int
    buffer: bytes = b""

    def run(self, devices: bytes | None) -> tuple[int, dict[str, Any]]:
        """Send one ``visible_devices`` job; its answer's flags and result."""
        os.write(self.requests, encode_request(b"job", b"visible_devices", b"{}", 1, 1, 0.0, devices))
        kind, flags, code, body = self.frame()
        assert kind == OK, (kind, code, body)
        result: dict[str, Any] = json.loads(body)
        return flags, result

    def frame(self) -> tuple[int, int, bytes, bytes]:
        """The next answer: kind, flags, code, body (fails the test after WITHIN seconds)."""
        deadline = time.monotonic() + WITHIN
        while True:
            if len(self.buffer) >= RESPONSE.size:
                kind, flags, code_len, body_len = RESPONSE.unpack_from(self.buffer)
                end = RESPONSE.size + code_len + body_len
                if len(self.buffer) >= end:
                    code = self.buffer[RESPONSE.size : RESPONSE.size + code_len]
                    body = self.buffer[RESPONSE.size + code_len : end]
                    self.buffer = self.buffer[end:]
                    return kind, flags, code, body
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.answers], [], [], left)[0]:
                pytest.fail(f"no answer from the runner within {WITHIN} s")
            data = os.read(self.answers, 1 << 16)
            if not data:
                pytest.fail(f"the runner closed its pipe (exit status {self.proc.wait(WITHIN)})")
            self.buffer += data


@pytest.fixture
def runner() -> Iterator[Runner]:
    """A runner process started as the pool starts one, whose own CUDA_VISIBLE_DEVICES is ``own``."""
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "own"}
    argv = [sys.executable, "-m", "runner.serve", "--in", str(req_r), "--out", str(resp_w)]
    argv += ["--parent", str(os.getpid()), "--import", "tests.unit.runner.devices_probe"]
    proc = subprocess.Popen(argv, pass_fds=(req_r, resp_w), env=env, cwd=ROOT, start_new_session=True)
    os.close(req_r)
    os.close(resp_w)
    r = Runner(proc, req_w, resp_r)
    try:
        kind, _, code, body = r.frame()
        assert kind == READY, (kind, code, body)
        yield r
    finally:
        os.close(req_w)
        if proc.poll() is None:
            proc.kill()
        proc.wait(WITHIN)
        os.close(resp_r)


def test_a_job_sees_its_devices_and_the_runner_s_own_value_comes_back_after(runner: Runner) -> None:
    # Given a runner whose own CUDA_VISIBLE_DEVICES is "own"
    # When the request leaves the variable alone (a worker without GPUs), the job sees the runner's own
    assert runner.run(None) == (0, {"devices": "own", "pid": runner.proc.pid})
    # When it says "no device" (a job without GPUs on a GPU worker), the job sees an empty list
    assert runner.run(b"") == (0, {"devices": "", "pid": runner.proc.pid})
    # And the next job that leaves it alone sees the runner's own value again: it was put back
    assert runner.run(None)[1]["devices"] == "own"


def test_the_answer_to_a_job_that_held_gpus_is_the_runner_s_last(runner: Runner) -> None:
    # Given a job holding two devices
    flags, result = runner.run(b"2,GPU-x")
    # Then it saw them, and the runner flagged its answer LAST and exits: CUDA would keep those devices
    assert result["devices"] == "2,GPU-x"
    assert flags & LAST
    assert runner.proc.wait(WITHIN) == 0


def test_a_failed_job_that_held_gpus_is_the_runner_s_last_too(runner: Runner) -> None:
    os.write(runner.requests, encode_request(b"job", b"visible_devices", b"[]", 1, 1, 0.0, b"0"))
    kind, flags, code, _ = runner.frame()
    assert (kind, code) == (FAILED, b"INVALID_PAYLOAD")
    assert flags & LAST
    assert runner.proc.wait(WITHIN) == 0
