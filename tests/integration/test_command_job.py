"""The opt-in ``command`` job type through the real control plane and a real worker, on 127.0.0.1.

A worker turns it on with ``--import runner.extra.command`` and ``CORRAL_COMMAND_ALLOW``; its schema
reaches the control plane when the worker registers, and bad payloads are refused at submit time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, wait_until
from tests.support.calls import field_of, request, result, rpc_error, submit, wait_done
from tests.support.processes import alive

S = jobs_pb2.Job
IMPORTS = ("runner.extra.command",)


def command_worker(cp: ControlProc, spawn_worker: Any, allow: str = "echo,sh,sleep", threads: int = 2) -> Any:
    return spawn_worker(cp, threads=threads, imports=IMPORTS, env={"CORRAL_COMMAND_ALLOW": allow})


def test_a_command_job_runs_end_to_end(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given a worker with two threads that allows echo and sh
    command_worker(control_plane, spawn_worker)
    # When a command job asking for two cores runs
    script = 'echo out; echo err >&2; printf "%s" "$OMP_NUM_THREADS"'
    done = wait_done(
        control_plane, submit(control_plane, "command", {"argv": ["sh", "-c", script]}, thread_demand=2).id
    )
    # Then it succeeded with its output, and saw its two threads
    assert done.state == S.SUCCEEDED, done.error
    out = result(done)
    assert (out["exit_code"], out["stdout"], out["stderr"]) == (0, "out\n2", "err\n")
    assert (out["stdout_bytes"], out["stderr_bytes"], out["truncated"]) == (5, 4, False)
    # And a failing command and an unlisted program fail with their codes
    failed = wait_done(
        control_plane, submit(control_plane, "command", {"argv": ["sh", "-c", "exit 4"]}, max_attempts=1).id
    )
    assert (failed.state, failed.error.code, failed.error.message) == (S.FAILED, "COMMAND_FAILED", "exit status 4")
    refused = wait_done(control_plane, submit(control_plane, "command", {"argv": ["cat"]}, max_attempts=1).id)
    assert (refused.state, refused.error.code) == (S.FAILED, "COMMAND_NOT_ALLOWED")
    assert "'cat'" in refused.error.message


BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"argv": "echo hi"}, "payload.argv", "is not of type 'array'"),
    ({"argv": ["echo"], "shell": True}, "payload", "'shell'"),
    ({"argv": []}, "payload.argv", "should be non-empty"),
    ({}, "payload", "'argv' is a required property"),
    ({"argv": ["echo", "a\x00b"]}, "payload.argv[1]", "does not match"),
    ({"argv": [""]}, "payload.argv[0]", "should be non-empty"),
    ({"argv": ["echo"], "memory_mb": 0}, "payload.memory_mb", "less than the minimum"),
    ({"argv": ["echo"], "max_output_bytes": 5 << 20}, "payload.max_output_bytes", "greater than the maximum"),
    ({"argv": ["echo"], "env": {"LD_PRELOAD": "/tmp/x.so"}}, "payload.env", "does not match"),
    ({"argv": ["echo"], "env": {"A": 1}}, "payload.env.A", "is not of type 'string'"),
]


@pytest.mark.parametrize(("payload", "field", "said"), BAD, ids=[f"{f}:{i}" for i, (_, f, _) in enumerate(BAD)])
def test_a_bad_payload_is_refused_at_submit_naming_the_field(
    control_plane: ControlProc, spawn_worker: Any, payload: dict[str, Any], field: str, said: str
) -> None:
    # Given a worker that advertised the command type and its schema
    command_worker(control_plane, spawn_worker)
    # When a bad payload is submitted
    err = rpc_error(control_plane.jobs.SubmitJob, request("command", payload))
    # Then it is INVALID_ARGUMENT naming the field, and nothing is stored
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert field_of(err) == field, err.details()  # type: ignore[attr-defined]
    assert said in (err.details() or "")  # type: ignore[attr-defined]
    assert int(control_plane.jobs.ListJobs(jobs_pb2.ListJobsRequest(limit=1)).total) == 0


def test_a_command_past_its_timeout_is_stopped_with_its_process(
    control_plane: ControlProc, spawn_worker: Any, tmp_path: Path
) -> None:
    # Given a command that writes its own pid, then becomes a 60 s sleep
    command_worker(control_plane, spawn_worker)
    pid_file = tmp_path / "pid"
    payload = {"argv": ["sh", "-c", f"echo $$ > {pid_file}.tmp && mv {pid_file}.tmp {pid_file}; exec sleep 60"]}
    # When it runs with a 0.5 s timeout
    job = submit(control_plane, "command", payload, timeout_sec=0.5, max_attempts=1)
    pid = int(wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the command's pid"))
    done = wait_done(control_plane, job.id)
    # Then the job FAILED with TIMEOUT, and the program is gone within a few seconds
    assert (done.state, done.error.code) == (S.FAILED, "TIMEOUT")
    wait_until(lambda: not alive(pid), timeout=5, what=f"the command (pid {pid}) to be gone")


def test_a_worker_without_the_allow_list_exits_2_naming_it(
    control_plane: ControlProc, spawn_worker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for env in ({}, {"CORRAL_COMMAND_ALLOW": ""}):
        # Given the variable unset, then empty
        monkeypatch.delenv("CORRAL_COMMAND_ALLOW", raising=False)
        # When a worker starts with the command plug-in
        worker = spawn_worker(control_plane, imports=IMPORTS, env=env, wait=False)
        # Then it exits 2, saying which variable is missing
        assert worker.wait(60) == 2
        log = worker.log.read_text()
        assert "cannot import job-type plug-in 'runner.extra.command': CORRAL_COMMAND_ALLOW must list" in log, log
