"""A real ``python -m runner.serve`` process, started as a worker's pool starts one, and the worker's
ends of its two pipes: tests send request frames and read its answers (:mod:`runner.wire`)."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from runner.wire import PRINTED, READY, RESPONSE, encode_request
from tests.conftest import ROOT

WITHIN = 30.0
"""How long a test waits for a runner's next frame before it fails."""

Frame = tuple[int, int, bytes, bytes]
"""An answer: kind, flags, code, body."""


@dataclass
class RunnerPipes:
    """A runner process, the ends of its pipes the worker would hold, and a reader of its frames."""

    proc: subprocess.Popen[bytes]
    requests: int
    answers: int
    buffer: bytes = b""

    def next_frame(self, within: float = WITHIN) -> Frame | None:
        """The next frame, None if none came within ``within`` seconds (fails if the pipe closed)."""
        deadline = time.monotonic() + within
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
                return None
            data = os.read(self.answers, 1 << 16)
            if not data:
                pytest.fail(f"the runner closed its pipe (exit status {self.proc.wait(WITHIN)})")
            self.buffer += data

    def frame(self) -> Frame:
        """The next frame; fails the test after WITHIN seconds."""
        frame = self.next_frame()
        if frame is None:
            pytest.fail(f"no answer from the runner within {WITHIN} s")
        return frame

    def answer_to(self, job_type: str) -> Frame:
        """Send one job of ``job_type`` with an empty payload; its answer (PRINTED frames before it skipped)."""
        os.write(self.requests, encode_request(b"job", job_type.encode(), b"{}", 1, 1, 0.0))
        while True:
            frame = self.frame()
            if frame[0] != PRINTED:
                return frame

    def close(self) -> None:
        """End the process (end of file on its requests, then a kill if it is still there)."""
        os.close(self.requests)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(WITHIN)
        os.close(self.answers)


def start_runner(*args: str, env: dict[str, str] | None = None) -> RunnerPipes:
    """Start ``python -m runner.serve`` with ``args`` (``--import``, ``--output-bytes`` ...) and ``env``
    added to this environment; returns once it said READY."""
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    argv = [sys.executable, "-m", "runner.serve", "--in", str(req_r), "--out", str(resp_w)]
    argv += ["--parent", str(os.getpid()), *args]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.Popen(argv, pass_fds=(req_r, resp_w), env=full_env, cwd=ROOT, start_new_session=True)
    os.close(req_r)
    os.close(resp_w)
    runner = RunnerPipes(proc, req_w, resp_r)
    try:
        kind, _, code, body = runner.frame()
        assert kind == READY, (kind, code, body)
    except BaseException:
        runner.close()
        raise
    return runner


@contextlib.contextmanager
def runners_importing(module: str) -> Iterator[Callable[..., RunnerPipes]]:
    """A :func:`start_runner` whose runners import ``module`` (test job types), as the pool starts them;
    every runner it started is closed on the way out (the body of a ``start_runner`` fixture)."""
    started: list[RunnerPipes] = []

    def start(*args: str) -> RunnerPipes:
        runner = start_runner("--import", module, *args)
        started.append(runner)
        return runner

    try:
        yield start
    finally:
        for runner in started:
            runner.close()
