"""Small wrappers over the generated stubs, so tests read as the behaviour they check."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import grpc
from google.protobuf import json_format, struct_pb2
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import error_details_pb2, status_pb2

from corral.v1 import jobs_pb2, jobs_pb2_grpc

TERMINAL = {jobs_pb2.Job.SUCCEEDED, jobs_pb2.Job.FAILED, jobs_pb2.Job.CANCELLED}


class Stubs(Protocol):
    """Anything with a ``jobs`` property returning a JobServiceStub (ControlProc)."""

    @property
    def jobs(self) -> jobs_pb2_grpc.JobServiceStub: ...


def stored(cp: Stubs) -> int:
    """How many jobs the control plane holds (ListJobs' total)."""
    total: int = cp.jobs.ListJobs(jobs_pb2.ListJobsRequest(), timeout=10).total
    return total


def request(type_: str, payload: dict[str, Any] | None = None, **fields: Any) -> jobs_pb2.SubmitJobRequest:
    req = jobs_pb2.SubmitJobRequest(type=type_, **fields)
    if payload:
        req.payload.update(payload)
    return req


def nested(levels: int) -> dict[str, Any]:
    """A payload with ``levels`` more objects nested in it: {"a": {"a": ...}}."""
    top: dict[str, Any] = {}
    inner = top
    for _ in range(levels):
        inner["a"] = {}
        inner = inner["a"]
    return top


def seconds_from_now(seconds: float) -> Timestamp:
    """A time ``seconds`` from now (for ``scheduled_at``)."""
    ts = Timestamp()
    ts.FromNanoseconds(int((time.time() + seconds) * 1e9))
    return ts


def submit(cp: Stubs, type_: str, payload: dict[str, Any] | None = None, **fields: Any) -> jobs_pb2.Job:
    resp: jobs_pb2.SubmitJobResponse = cp.jobs.SubmitJob(request(type_, payload, **fields), timeout=30)
    return resp.job


def submit_many(cp: Stubs, reqs: list[jobs_pb2.SubmitJobRequest]) -> list[jobs_pb2.Job]:
    out: list[jobs_pb2.Job] = []
    for i in range(0, len(reqs), 5000):
        resp = cp.jobs.SubmitJobs(jobs_pb2.SubmitJobsRequest(jobs=reqs[i : i + 5000]), timeout=120)
        out.extend(resp.jobs)
    return out


def watch(cp: Stubs, job_id: str, timeout: float = 30.0) -> list[jobs_pb2.Job]:
    """Every event of WatchJob until a terminal state; the last one is terminal."""
    events = [e.job for e in cp.jobs.WatchJob(jobs_pb2.WatchJobRequest(id=job_id), timeout=timeout)]
    assert events and events[-1].state in TERMINAL, f"watch of {job_id} ended at {events[-1:]}"
    return events


def wait_done(cp: Stubs, job_id: str, timeout: float = 30.0) -> jobs_pb2.Job:
    return watch(cp, job_id, timeout)[-1]


def wait_all_done(cp: Stubs, job_ids: list[str], timeout: float = 120.0) -> list[jobs_pb2.Job]:
    """Poll until every job is terminal (cheaper than a watch per job for big batches)."""
    deadline = time.monotonic() + timeout
    pending = set(job_ids)
    done: dict[str, jobs_pb2.Job] = {}
    while pending:
        for job_id in list(pending):
            job = cp.jobs.GetJob(jobs_pb2.GetJobRequest(id=job_id), timeout=30)
            if job.state in TERMINAL:
                done[job_id] = job
                pending.discard(job_id)
            else:
                break
        if pending and time.monotonic() > deadline:
            raise AssertionError(f"{len(pending)} jobs not finished after {timeout}s")
        if pending:
            time.sleep(0.05)
    return [done[j] for j in job_ids]


def result(job: jobs_pb2.Job) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(json.dumps(json_format.MessageToDict(job.result)))
    return value


def struct(value: dict[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s


def rpc_error(fn: Any, *args: Any, **kwargs: Any) -> grpc.RpcError:
    """Call ``fn`` expecting a gRPC error; returns it."""
    try:
        fn(*args, **kwargs)
    except grpc.RpcError as err:
        return err
    raise AssertionError("expected the call to fail")


@contextmanager
def submitting(cp: Stubs, req: jobs_pb2.SubmitJobRequest) -> Iterator[tuple[list[str], list[grpc.RpcError]]]:
    """Submit ``req`` again and again on a thread until the block ends or a call is refused; yields the
    ids acknowledged and the refusals, as they come (other threads may add their refusals)."""
    acked: list[str] = []
    refused: list[grpc.RpcError] = []
    stop = threading.Event()

    def run() -> None:
        stub = cp.jobs
        while not stop.is_set():
            try:
                acked.append(stub.SubmitJob(req, timeout=10).job.id)
            except grpc.RpcError as err:
                refused.append(err)
                return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield acked, refused
    finally:
        stop.set()
        thread.join(30)


def executions(path: Path) -> list[tuple[str, int]]:
    """Lines written by the ``record`` job type: (job_id, attempt) per execution."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        job_id, attempt, *_ = line.split()
        out.append((job_id, int(attempt)))
    return out


def field_of(err: grpc.RpcError) -> str:
    """The field an INVALID_ARGUMENT names in its BadRequest detail ("" when it names none)."""
    for key, value in err.trailing_metadata() or ():  # type: ignore[attr-defined]
        if key == "grpc-status-details-bin":
            for detail in status_pb2.Status.FromString(value).details:
                bad = error_details_pb2.BadRequest()
                if detail.Unpack(bad):
                    return str(bad.field_violations[0].field)
    return ""
