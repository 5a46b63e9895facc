"""What jobs print, kept per attempt, on a real control plane and real workers: the end of their
stdout and stderr (CORRAL_JOB_OUTPUT_BYTES on the worker), with any outcome, over gRPC, REST and the CLI."""

from __future__ import annotations

from typing import Any

from corral.v1 import jobs_pb2
from tests.conftest import ControlProc
from tests.integration.test_rest import Rest
from tests.support import cli
from tests.support.calls import submit, wait_done

S = jobs_pb2.Job


def _lines(n: int) -> str:
    """What ``chatty`` prints for ``n`` lines."""
    out = []
    for i in range(1, n + 1):
        out.append(f"out {i}\n")
        if i % 10 == 0:
            out.append(f"err {i}\n")
    return "".join(out)


def test_what_a_job_prints_is_kept_with_any_outcome(control_plane: ControlProc, spawn_worker: Any) -> None:
    spawn_worker(control_plane, threads=2)
    # a job that succeeds: its stdout and stderr, in the order printed
    ok = wait_done(control_plane, submit(control_plane, "chatty", {"lines": 25}).id)
    assert ok.state == S.SUCCEEDED and ok.output == _lines(25)
    # a job that fails: what it printed before failing is what tells why
    failed = wait_done(control_plane, submit(control_plane, "chatty", {"lines": 3, "fail": True}, max_attempts=1).id)
    assert (failed.state, failed.error.code, failed.output) == (S.FAILED, "CHATTY", _lines(3))
    # a quiet job has none
    assert wait_done(control_plane, submit(control_plane, "noop").id).output == ""
    # over REST too, and `corral output` prints it as it is
    assert Rest(control_plane.http_port).get(f"/v1/jobs/{ok.id}").json()["output"] == _lines(25)
    shown = cli.corral("output", ok.id, "--control", control_plane.address)
    assert (shown.returncode, shown.stdout) == (0, _lines(25))


def test_a_long_output_keeps_its_end(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given a worker that keeps 1 KiB of each attempt's output
    spawn_worker(control_plane, threads=1, env={"CORRAL_JOB_OUTPUT_BYTES": "1024"})
    # When a job prints about a megabyte
    job = wait_done(control_plane, submit(control_plane, "chatty", {"lines": 100_000}).id)
    # Then the end is kept, and the first line says how much came before
    first, kept = job.output.split("\n", 1)
    assert first.startswith("[... ") and first.endswith("characters before this were cut]")
    assert len(kept.encode()) <= 1024 and kept.endswith("out 99999\nout 100000\nerr 100000\n")
    assert int(first.split()[1]) + len(kept) == len(_lines(100_000))


def test_a_worker_can_keep_none(control_plane: ControlProc, spawn_worker: Any) -> None:
    spawn_worker(control_plane, threads=1, env={"CORRAL_JOB_OUTPUT_BYTES": "0"})
    job = wait_done(control_plane, submit(control_plane, "chatty", {"lines": 5}).id)
    assert (job.state, job.output) == (S.SUCCEEDED, "")
