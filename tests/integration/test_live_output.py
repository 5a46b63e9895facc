"""What a job prints, followed while it runs (WatchOutput), on a real control plane and real workers:
over gRPC, the Python client, REST and ``corral output --follow``; through retries, a job that prints
too fast, and a control-plane restart. Every chunk is checked against what the job really printed at
the offset the chunk names, so a character shown twice, out of order or at the wrong place fails."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import corral
from corral import follow
from corral.errors import NotFound
from corral.job import JobState
from corral.printed import OutputChunk, split_cut_note
from corral.v1 import jobs_pb2
from tests.conftest import ROOT, ControlProc, base_env, wait_until
from tests.integration.test_output import _lines
from tests.integration.test_rest import Rest
from tests.support import cli
from tests.support.calls import submit, wait_done

WINDOW_CHARS = 16 * 1024
"""The most a worker sends of a job's output at a time (runner.output)."""


def _check(chunks: list[OutputChunk], printed: dict[int, str]) -> None:
    """Each chunk is what its attempt printed at its offset, and each starts at or past the end of the
    one before it of the same attempt (nothing twice, nothing out of order)."""
    ends: dict[int, int] = {}
    for c in chunks:
        assert c.text == printed[c.attempt][c.offset : c.end], c
        assert c.offset >= ends.get(c.attempt, 0), c
        ends[c.attempt] = c.end


def _text(chunks: list[OutputChunk], attempt: int = 1) -> str:
    return "".join(c.text for c in chunks if c.attempt == attempt)


class _Collector:
    """Follows a job's output with ``Client.watch_output`` on a thread of its own."""

    def __init__(self, address: str, job_id: str) -> None:
        self.chunks: list[OutputChunk] = []
        self.error: BaseException | None = None
        self._client = corral.Client(address)
        self._thread = threading.Thread(target=self._run, args=(job_id,), daemon=True)
        self._thread.start()

    def _run(self, job_id: str) -> None:
        try:
            for chunk in self._client.watch_output(job_id):
                self.chunks.append(chunk)
        except BaseException as exc:  # the test reads it
            self.error = exc

    def text(self, attempt: int = 1) -> str:
        return _text(list(self.chunks), attempt)

    def join(self, timeout: float = 30.0) -> list[OutputChunk]:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the watch did not end with the job"
        self._client.close()
        if self.error is not None:
            raise self.error
        return self.chunks


def test_a_follower_sees_what_a_job_prints_while_it_runs(
    control_plane: ControlProc, spawn_worker: Any, tmp_path: Path
) -> None:
    spawn_worker(control_plane, threads=1)
    hold = tmp_path / "go"
    # Given a job that prints 12 lines, 50 ms apart, then waits for a file
    job = submit(control_plane, "chatty", {"lines": 12, "every": 0.05, "hold": str(hold)})
    follower = _Collector(control_plane.address, job.id)
    # Then the follower has every line while the job still runs, in pieces as they were printed
    wait_until(lambda: follower.text() == _lines(12), 15, what="the 12 lines, live")
    with corral.Client(control_plane.address) as client:
        assert client.get(job.id).state is JobState.RUNNING
        # and a watch that starts now begins with what was printed so far
        late = client.watch_output(job.id)
        assert next(late) == OutputChunk(1, 0, _lines(12))
        late.close()
    # When the job ends, the watch ends, with nothing shown twice or out of place
    hold.touch()
    chunks = follower.join()
    _check(chunks, {1: _lines(12)})
    assert _text(chunks) == _lines(12) and len(chunks) >= 2
    assert wait_done(control_plane, job.id).output == _lines(12)


def test_an_ended_job_gives_its_stored_output_over_grpc_rest_and_the_cli(
    control_plane: ControlProc, spawn_worker: Any
) -> None:
    # Given a job that ended, of whose output its worker kept the last KiB
    spawn_worker(control_plane, threads=1, env={"CORRAL_JOB_OUTPUT_BYTES": "1024"})
    job = wait_done(control_plane, submit(control_plane, "chatty", {"lines": 1000}).id)
    offset, text = split_cut_note(job.output)
    assert offset > 0 and _lines(1000)[offset:] == text
    # Then a watch gets that end at its place, and ends
    chunks = list(control_plane.jobs.WatchOutput(jobs_pb2.WatchOutputRequest(id=job.id), timeout=30))
    assert [(c.attempt, c.offset, c.text) for c in chunks] == [(1, offset, text)]
    # over REST as newline-delimited JSON (int64 as a string, as protojson writes it)
    reply = Rest(control_plane.http_port).get(f"/v1/jobs/{job.id}:watchOutput")
    assert reply.status == 200 and reply.headers["Content-Type"] == "application/x-ndjson"
    results = [json.loads(line)["result"] for line in reply.body.splitlines()]
    assert results == [{"attempt": 1, "offset": str(offset), "text": text}]
    # and `corral output -f` prints the text on stdout and what was left out on stderr
    shown = cli.corral("output", "-f", job.id, "--control", control_plane.address)
    assert (shown.returncode, shown.stdout) == (0, text)
    assert f"[... {offset} characters left out]" in shown.stderr
    as_json = cli.corral("output", "--follow", "--json", job.id, "--control", control_plane.address)
    assert [json.loads(line) for line in as_json.stdout.splitlines()] == [
        {"attempt": 1, "offset": offset, "text": text}
    ]


def _queued_behind(cp: ControlProc, spawn_worker: Any, gate: Path) -> None:
    """Start a one-slot worker and hold it with a quiet job until ``gate`` exists, so that the next
    job waits (PENDING) until then: a watch can start before it does."""
    spawn_worker(cp, threads=1)
    blocker = submit(cp, "chatty", {"lines": 0, "hold": str(gate)})
    wait_until(lambda: cp.jobs.GetJob(jobs_pb2.GetJobRequest(id=blocker.id)).state == jobs_pb2.Job.RUNNING)


def test_a_watch_follows_a_job_through_its_retries(
    control_plane: ControlProc, spawn_worker: Any, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    _queued_behind(control_plane, spawn_worker, gate)
    # Given a job that prints 3 lines 100 ms apart and fails, twice (its last attempt)
    job = submit(control_plane, "chatty", {"lines": 3, "every": 0.1, "fail": True}, max_attempts=2)
    follower = _Collector(control_plane.address, job.id)  # watching before it starts
    gate.touch()
    # Then the watch shows each attempt's lines, named by attempt, and ends when the job is FAILED
    chunks = follower.join()
    _check(chunks, {1: _lines(3), 2: _lines(3)})
    assert (_text(chunks, 1), _text(chunks, 2)) == (_lines(3), _lines(3))
    assert wait_done(control_plane, job.id).state == jobs_pb2.Job.FAILED


def test_a_job_that_prints_too_fast_is_streamed_in_bounded_pieces(
    control_plane: ControlProc, spawn_worker: Any, tmp_path: Path
) -> None:
    gate, hold = tmp_path / "gate", tmp_path / "go"
    _queued_behind(control_plane, spawn_worker, gate)
    printed = _lines(200_000)  # about 1.4 MB, printed in a fraction of a second
    job = submit(control_plane, "chatty", {"lines": 200_000, "hold": str(hold)})
    follower = _Collector(control_plane.address, job.id)  # watching before it starts
    gate.touch()
    # Then the live pieces reach the end of what it printed, each at most a window long, with text
    # left out in between (the offsets say where)
    wait_until(lambda: follower.chunks and follower.chunks[-1].end == len(printed), 30, what="the last line, live")
    hold.touch()
    chunks = follower.join()
    _check(chunks, {1: printed})
    assert all(len(c.text) <= WINDOW_CHARS for c in chunks)
    assert sum(len(c.text) for c in chunks) < len(printed) // 4
    assert chunks[-1].end == len(printed)


def test_a_watch_of_an_unknown_job_is_not_found(control_plane: ControlProc) -> None:
    with corral.Client(control_plane.address) as client, pytest.raises(NotFound):
        next(client.watch_output("no-such-job"))
    reply = Rest(control_plane.http_port).get("/v1/jobs/no-such-job:watchOutput")
    assert reply.status == 404


def test_the_follow_rides_through_a_control_plane_restart(
    control_plane: ControlProc, spawn_worker: Any, tmp_path: Path
) -> None:
    spawn_worker(control_plane, threads=1)
    hold = tmp_path / "go"
    # Given a job printing a line every 50 ms for 3 s, followed with corral output --follow
    job = submit(control_plane, "chatty", {"lines": 60, "every": 0.05, "hold": str(hold)})
    follow = subprocess.Popen(
        [*cli.CORRAL, "output", "--follow", "--json", job.id, "--control", control_plane.address],
        cwd=ROOT,
        env=base_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert follow.stdout is not None
    first = json.loads(follow.stdout.readline())
    # When the control plane restarts while the job runs on (its worker stays up)
    control_plane.stop()
    control_plane.start()
    hold.touch()
    # Then the follow goes on to the job's end, nothing shown twice or out of place
    out, err = follow.communicate(timeout=60)
    assert follow.returncode == 0, err
    chunks = [OutputChunk(**first)] + [OutputChunk(**json.loads(line)) for line in out.splitlines()]
    _check(chunks, {1: _lines(60)})
    assert chunks[-1].end == len(_lines(60))  # the end (the stored output fills what the outage missed)
    assert wait_done(control_plane, job.id).attempts == 1


def test_the_asyncio_client_follows_too(control_plane: ControlProc, spawn_worker: Any) -> None:
    spawn_worker(control_plane, threads=1)

    async def main() -> list[OutputChunk]:
        async with corral.AsyncClient(control_plane.address) as client:
            job = await client.submit("chatty", {"lines": 8, "every": 0.05})
            return [chunk async for chunk in client.watch_output(job.id)]

    chunks = asyncio.run(main())
    _check(chunks, {1: _lines(8)})
    assert _text(chunks) == _lines(8) and len(chunks) >= 2


def test_submit_follow_prints_what_the_job_prints_then_exits_as_wait_does(
    control_plane: ControlProc, spawn_worker: Any
) -> None:
    spawn_worker(control_plane, threads=1)
    address = control_plane.address
    # A job that succeeds: its text on stdout, exactly; the job's id on stderr; exit 0
    ok = cli.corral("submit", "chatty", "--payload", '{"lines": 12, "every": 0.02}', "-f", "--control", address)
    assert (ok.returncode, ok.stdout) == (0, _lines(12)), ok.stderr
    assert ok.stderr.startswith("Submitted job ")
    # A job that fails its two attempts: both attempts' text, the second announced on stderr; exit 1
    # with the job's end in one line
    payload = '{"lines": 2, "every": 0.05, "fail": true}'
    failed = cli.corral(
        "submit", "chatty", "--payload", payload, "--max-attempts", "2", "--follow", "--control", address
    )
    assert (failed.returncode, failed.stdout) == (1, _lines(2) * 2)
    assert "--- attempt 2 ---" in failed.stderr and "ended FAILED: CHATTY" in failed.stderr
    # --json: one chunk per line, then the job
    as_json = cli.corral("submit", "chatty", "--payload", '{"lines": 3}', "-f", "--json", "--control", address)
    *chunks, last = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert as_json.returncode == 0 and "".join(c["text"] for c in chunks) == _lines(3)
    assert (last["state"], last["output"]) == ("SUCCEEDED", _lines(3))


def test_a_follow_of_a_quiet_job_rides_through_an_outage_past_the_first_contact_limit(
    control_plane: ControlProc, spawn_worker: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A follow gives up after FIRST_CONTACT_LIMIT_SEC of outage only if the control plane never
    # answered: the first message comes at once, empty, even for a job that printed nothing.
    monkeypatch.setattr(follow, "FIRST_CONTACT_LIMIT_SEC", 0.5)
    spawn_worker(control_plane, threads=1)
    hold = tmp_path / "go"
    job = submit(control_plane, "chatty", {"lines": 0, "hold": str(hold)})
    wait_until(lambda: control_plane.jobs.GetJob(jobs_pb2.GetJobRequest(id=job.id)).state == jobs_pb2.Job.RUNNING)
    heard = threading.Event()
    reached = follow.Follow.reached

    def heard_then_reached(self: follow.Follow) -> None:
        heard.set()
        reached(self)

    pauses: list[float] = []  # when the client paused before watching again
    pause = follow.Follow.pause

    def noted_pause(self: follow.Follow, error: Any) -> float:
        pauses.append(time.monotonic())
        return pause(self, error)

    monkeypatch.setattr(follow.Follow, "reached", heard_then_reached)
    monkeypatch.setattr(follow.Follow, "pause", noted_pause)
    follower = _Collector(control_plane.address, job.id)
    wait_until(heard.is_set, 10, what="the watch's first, empty, message")
    # When the control plane is away until the client's own retries span twice that limit, then back
    control_plane.stop()
    wait_until(
        lambda: follower.error is not None or (len(pauses) > 1 and pauses[-1] - pauses[0] > 1.0),
        30,
        what="retries spanning twice the first-contact limit",
    )
    control_plane.start()
    hold.touch()
    # Then the follow went on, and ended with the job, which printed nothing
    assert follower.join() == []
    assert wait_done(control_plane, job.id).state == jobs_pb2.Job.SUCCEEDED


def test_a_follow_goes_on_when_the_job_s_worker_is_killed_and_another_runs_it(
    control_plane: ControlProc, spawn_worker: Any
) -> None:
    workers = {w.worker_id: w for w in (spawn_worker(control_plane, threads=1) for _ in range(2))}
    # Given a job printing 40 lines, 50 ms apart, followed from the start
    job = submit(control_plane, "chatty", {"lines": 40, "every": 0.05})
    follower = _Collector(control_plane.address, job.id)
    wait_until(lambda: "out 3\n" in follower.text(1), 15, what="the first lines, live")
    # When its worker is killed mid-job (kill -9: no result, no stored output for that attempt)
    running_on = control_plane.jobs.GetJob(jobs_pb2.GetJobRequest(id=job.id)).worker_id
    workers[running_on].kill()
    # Then the job runs again on the other worker, and the follow shows both attempts, each in order
    # and at its place, and ends with the job
    chunks = follower.join(60)
    _check(chunks, {1: _lines(40), 2: _lines(40)})
    assert _text(chunks, 2) == _lines(40)
    done = wait_done(control_plane, job.id)
    assert (done.state, done.attempts) == (jobs_pb2.Job.SUCCEEDED, 2)
