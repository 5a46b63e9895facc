"""Structured logs of real processes on 127.0.0.1: one event per line (JSON or logfmt), the event
names of system E where they happen, and the request id of the call that created a job on that
job's lines (submitted, dispatched, completed, retried, failed), over gRPC and REST."""

from __future__ import annotations

import json
import re
import secrets
import signal
import uuid
from pathlib import Path
from typing import Any

import corral
from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, wait_until
from tests.integration.test_cli import Up, make_up  # noqa: F401 (the fixture)
from tests.integration.test_rest import Rest
from tests.support.calls import request, submit, wait_done

LOGFMT = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S*)')


def json_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a JSON log; fails on a line that is not one JSON object."""
    out = []
    for line in path.read_text().splitlines():
        value = json.loads(line)
        assert isinstance(value, dict) and "event" in value and "level" in value, line
        out.append(value)
    return out


def logfmt_lines(path: Path) -> list[dict[str, str]]:
    """Every line of a logfmt log as a dict; fails on a line that is not all ``key=value`` pairs."""
    out = []
    for line in path.read_text().splitlines():
        pairs = LOGFMT.findall(line)
        assert " ".join(f"{k}={v}" for k, v in pairs) == line, line
        out.append({k: json.loads(v) if v.startswith('"') else v for k, v in pairs})
    return out


def events(lines: list[dict[str, Any]], event: str, **fields: Any) -> list[dict[str, Any]]:
    return [x for x in lines if x["event"] == event and all(x.get(k) == v for k, v in fields.items())]


def test_a_jobs_lines_carry_the_request_id_of_the_call_that_created_it(
    control_plane: ControlProc, spawn_worker: Any
) -> None:
    # Given a control plane logging JSON at info, with a worker
    spawn_worker(control_plane, threads=2, imports=())
    rest = Rest(control_plane.http_port)

    # When jobs are made by a gRPC call, a REST call and a batch, each with its own request id
    rid_grpc, rid_rest, rid_batch = (f"req-{uuid.uuid4().hex}" for _ in range(3))
    by_grpc, _ = control_plane.jobs.SubmitJob.with_call(
        request("add_numbers", {"a": 1, "b": 2}), metadata=(("x-request-id", rid_grpc),), timeout=10
    )
    by_rest = rest.submit({"type": "noop"}, headers={"X-Request-ID": rid_rest})
    batch, _ = control_plane.jobs.SubmitJobs.with_call(
        jobs_pb2.SubmitJobsRequest(jobs=[request("noop"), request("noop")]),
        metadata=(("x-request-id", rid_batch),),
        timeout=10,
    )
    made = {by_grpc.job.id: rid_grpc, by_rest["id"]: rid_rest, **{j.id: rid_batch for j in batch.jobs}}
    for job_id in made:
        assert wait_done(control_plane, job_id).state == jobs_pb2.Job.SUCCEEDED

    # Then each job's submitted, dispatched and completed lines name the request that created it
    def logged() -> list[dict[str, Any]] | None:
        lines = json_lines(control_plane.log)
        done = all(events(lines, "job_completed", job_id=j) for j in made)
        return lines if done else None

    lines = wait_until(logged, what="job_completed lines")
    assert lines is not None
    for job_id, rid in made.items():
        for event in ("job_submitted", "job_dispatched", "job_completed"):
            (line,) = events(lines, event, job_id=job_id)
            assert line["request_id"] == rid, line
            assert line["level"] == "info" and line["logger"].startswith("control.")
    (dispatched,) = events(lines, "job_dispatched", job_id=by_grpc.job.id)
    assert dispatched["attempt"] == 1 and dispatched["worker_id"]
    # and a line of another request names that request, not the jobs' ones
    assert not [x for x in lines if x.get("request_id") == rid_grpc and x.get("job_id") not in (None, by_grpc.job.id)]
    # worker_heartbeat is a debug event: not at info
    assert events(lines, "worker_registered") and not events(lines, "worker_heartbeat")


def test_a_jobs_lines_keep_its_request_id_across_a_control_plane_restart(
    control_plane: ControlProc, spawn_worker: Any
) -> None:
    # Given a job created by a call with a request id, running
    spawn_worker(control_plane, threads=1, imports=())
    rid = f"req-{uuid.uuid4().hex}"
    made, _ = control_plane.jobs.SubmitJob.with_call(
        request("sleep", {"seconds": 1.5}), metadata=(("x-request-id", rid),), timeout=10
    )
    job_id = made.job.id
    wait_until(lambda: control_plane.get(job_id).state == jobs_pb2.Job.RUNNING, what="the job to run")

    # When the control plane restarts under it
    assert control_plane.stop() == 0
    control_plane.start()
    assert wait_done(control_plane, job_id).state == jobs_pb2.Job.SUCCEEDED

    # Then the restarted control plane's line about the job still names the request (from the store)
    def completed() -> list[dict[str, Any]] | None:
        found = events(json_lines(control_plane.log), "job_completed", job_id=job_id)
        return found or None

    found = wait_until(completed, what="the job_completed line")
    assert found is not None
    (line,) = found
    assert line["request_id"] == rid, line


def test_retries_failures_and_stale_workers_are_logged(control_plane: ControlProc, spawn_worker: Any) -> None:
    worker = spawn_worker(control_plane)
    rid = f"req-{uuid.uuid4().hex}"
    failing, _ = control_plane.jobs.SubmitJob.with_call(
        request("failing", {"message": "boom"}, max_attempts=2), metadata=(("x-request-id", rid),), timeout=10
    )
    assert wait_done(control_plane, failing.job.id).state == jobs_pb2.Job.FAILED

    # When the worker is killed, the reaper finds it stale
    worker.kill()
    wait_until(lambda: events(json_lines(control_plane.log), "worker_stale"), what="worker_stale")

    lines = json_lines(control_plane.log)
    (retry,) = events(lines, "job_retry_scheduled", job_id=failing.job.id)
    (failed,) = events(lines, "job_failed", job_id=failing.job.id)
    assert (retry["request_id"], retry["attempt"], retry["reason"]) == (rid, 1, "ERROR") and retry["delay_sec"] >= 0
    assert (failed["request_id"], failed["attempt"], failed["reason"]) == (rid, 2, "ERROR")
    (stale,) = events(lines, "worker_stale", worker_id=worker.worker_id)
    assert stale["level"] == "warning"


def test_logfmt_and_debug_show_heartbeats_on_both_sides(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given the control plane restarted with logfmt at debug, and a worker logging logfmt at debug
    assert control_plane.stop() == 0
    control_plane.log.unlink()
    control_plane.env.update(CORRAL_LOG_FORMAT="logfmt", CORRAL_LOG_LEVEL="debug")
    control_plane.start()
    worker = spawn_worker(control_plane, env={"CORRAL_LOG_FORMAT": "logfmt", "CORRAL_LOG_LEVEL": "debug"})
    job = submit(control_plane, "noop")
    wait_done(control_plane, job.id)

    # Then heartbeats show at debug, and every line of both logs is logfmt
    wait_until(
        lambda: events(logfmt_lines(control_plane.log), "worker_heartbeat", worker_id=worker.worker_id),
        what="worker_heartbeat at debug",
    )
    lines = logfmt_lines(control_plane.log)
    assert events(lines, "job_completed", job_id=job.id)[0]["level"] == "info"
    assert events(lines, "worker_heartbeat")[0]["level"] == "debug"
    assert events(logfmt_lines(worker.log), "worker_registered", worker_id=worker.worker_id)
    wait_until(lambda: events(logfmt_lines(worker.log), "worker_heartbeat", level="debug"), what="worker heartbeats")


def test_corral_up_passes_log_flags_to_its_children(tmp_path: Path, make_up: Any) -> None:  # noqa: F811
    logs = tmp_path / "logs"
    up: Up = make_up(
        *("--grpc-port", "0", "--http-port", "0", "--db", str(tmp_path / "c.db"), "--workers", "1"),
        *("--threads", "1", "--log-dir", str(logs), "--log-format", "logfmt", "--log-level", "debug"),
    )
    up.wait_up()
    wait_until(
        lambda: events(logfmt_lines(logs / "control.log"), "worker_heartbeat"), what="control plane heartbeat lines"
    )
    assert events(logfmt_lines(logs / "worker-1.log"), "worker_registered")
    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(60) == 0


def test_with_tokens_each_line_names_who_made_the_call(make_control_plane: Any, spawn_worker: Any) -> None:
    # Given a control plane with client tokens, where alice and ops each have one
    alice, ops, worker = (secrets.token_urlsafe(24) for _ in range(3))
    cp = make_control_plane(CORRAL_AUTH_TOKENS=f"alice:{alice},ops:{ops}", CORRAL_WORKER_TOKEN=worker)
    cp.token = ops
    spawn_worker(cp, threads=2, env={"CORRAL_WORKER_TOKEN": worker})
    with corral.Client(cp.address, token=alice) as a, corral.Client(cp.address, token=ops) as o:
        # When alice submits jobs, ops cancels one and re-drives another that failed
        running = a.submit("sleep", {"seconds": 30})
        failed = a.submit("failing", max_attempts=1)
        assert a.wait(failed.id, timeout=30).state.name == "FAILED"
        o.cancel(running.id)
        o.retry(failed.id)
    # Then the log says who did what: the audit trail of a shared control plane
    (submitted,) = [e for e in cp.events("job_submitted") if e["job_id"] == running.id]
    assert submitted["principal"] == "alice"
    wait_until(lambda: cp.events("job_retried"), what="the job_retried line")
    assert [(e["job_id"], e["principal"]) for e in cp.events("job_cancelled")] == [(running.id, "ops")]
    assert [(e["job_id"], e["principal"]) for e in cp.events("job_retried")] == [(failed.id, "ops")]
