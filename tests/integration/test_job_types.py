"""Every built-in job type through the real control plane and a real worker, on 127.0.0.1.

Covers: results of the kernel and I/O types end to end (webhook, email and network_intensive
against local servers), binary array payloads and the payload limit, bad payloads of every type
refused at submit with the field named, a compiled kernel killed at its timeout (no process left,
the worker keeps serving), the per-job memory limit, ``thread_demand`` 2 using two cores, and a job
type added by an entry point.
"""

from __future__ import annotations

import base64
import hashlib
import math
import os
import random
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from corral import Client
from corral.v1 import jobs_pb2, jobs_pb2_grpc
from runner import JobContext, execute
from runner.arrays import encode_npy
from tests.conftest import ROOT, ControlProc, wait_until
from tests.integration.test_rest import Rest, http_port
from tests.support.calls import field_of, request, result, rpc_error, submit, wait_done
from tests.support.ports import free_port
from tests.support.processes import alive, children
from tests.unit.runner.local_servers import local_http, local_smtp
from tests.unit.runner.plugin_dist import make_plugin_distribution

S = jobs_pb2.Job
TICK = os.sysconf("SC_CLK_TCK")


def local(job_type: str, payload: dict[str, Any], threads: int = 1) -> dict[str, Any]:
    """The same job run in this process: the reference for results that have no closed form."""
    return execute(job_type, payload, JobContext("ref", 1, threads))


def succeeded(cp: ControlProc, job_type: str, payload: dict[str, Any], **fields: Any) -> dict[str, Any]:
    done = wait_done(cp, submit(cp, job_type, payload, **fields).id, timeout=120)
    assert done.state == S.SUCCEEDED, (job_type, done.error)
    return result(done)


def test_kernel_types_end_to_end(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given a worker with two threads
    spawn_worker(control_plane, threads=2)
    # When each kernel job asks for both threads, Then its result is the reference's
    rng = random.Random(1)
    numbers = [rng.randrange(-(2**40), 2**40) for _ in range(5000)]  # a JSON result is exact to 2**53
    assert succeeded(control_plane, "large_array_sum", {"numbers": numbers}, thread_demand=2) == {"sum": sum(numbers)}
    floats = [0.1] * 10 + [1e16, -1e16]
    assert succeeded(control_plane, "large_array_sum", {"numbers": floats, "dtype": "float64"}) == {
        "sum": math.fsum(floats)
    }
    assert succeeded(control_plane, "cpu_intensive", {"n": 10**7}, thread_demand=2) == {"primes": 664579}
    rounds = {"rounds": 20000, "seed": 3}
    assert succeeded(control_plane, "cpu_intensive", rounds, thread_demand=2) == local("cpu_intensive", rounds)
    mc = succeeded(control_plane, "monte_carlo_pi", {"samples": 10**7, "seed": 11}, thread_demand=2)
    assert mc == local("monte_carlo_pi", {"samples": 10**7, "seed": 11}) and abs(mc["pi"] - math.pi) < 0.002
    mm = succeeded(control_plane, "matmul", {"n": 300, "m": 170, "k": 230, "seed": 5}, thread_demand=2)
    assert mm["checksum"] == local("matmul", {"n": 300, "m": 170, "k": 230, "seed": 5})["checksum"]
    assert (mm["rows"], mm["cols"], mm["inner"]) == (170, 300, 230)
    img = np.random.default_rng(0).integers(0, 256, (61, 83, 3), dtype=np.uint8)
    raw = {"width": 83, "height": 61, "target_width": 20, "target_height": 15, "method": "area",
           "pixels_b64": base64.b64encode(img.tobytes()).decode()}  # fmt: skip
    resized = succeeded(control_plane, "resize_image", raw, thread_demand=2)
    assert resized == local("resize_image", raw)


class BigMessages:
    """JobService stubs on a channel that takes messages up to 64 MiB (jobs echo their payload)."""

    def __init__(self, cp: ControlProc) -> None:
        self._channel = grpc.insecure_channel(
            cp.address,
            options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)],
        )
        self.jobs = jobs_pb2_grpc.JobServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()


def test_binary_arrays_need_the_operator_to_raise_the_payload_limit(make_control_plane: Any, spawn_worker: Any) -> None:
    values = np.random.default_rng(2).integers(-(2**63), 2**63 - 1, 1_000_000, dtype=np.int64)
    payload = {"array_b64": encode_npy(values)}
    # With the default 1 MiB limit the 10.7 MB payload is refused, naming the payload
    default = make_control_plane()
    err = rpc_error(default.jobs.SubmitJob, request("large_array_sum", payload))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert (err.details() or "").startswith("payload: is ")  # type: ignore[attr-defined]
    # With CORRAL_MAX_PAYLOAD_BYTES raised it runs, and the sum is exact (as text: beyond 2**53)
    raised = make_control_plane(CORRAL_MAX_PAYLOAD_BYTES=16 << 20)
    spawn_worker(raised, threads=2)
    client = BigMessages(raised)  # the job (with its payload) is larger than gRPC's default 4 MiB
    try:
        done = wait_done(client, submit(client, "large_array_sum", payload, thread_demand=2).id, timeout=120)
    finally:
        client.close()
    assert done.state == S.SUCCEEDED, done.error
    out = result(done)
    exact = sum(values.tolist())
    assert out["sum_text"] == str(exact) and out["count"] == 1_000_000 and out["dtype"] == "int64"
    assert out["fits_int64"] == (-(2**63) <= exact < 2**63)


def test_network_intensive_webhook_and_io_against_local_servers(control_plane: ControlProc, spawn_worker: Any) -> None:
    spawn_worker(control_plane, threads=1)
    with local_http() as server:
        got = succeeded(control_plane, "network_intensive", {"url": f"{server.url}/bytes/2000000?seed=9"})
        assert got["bytes"] == 2_000_000 and got["status"] == 200
        assert got["sha256"] == hashlib.sha256(random.Random(9).randbytes(2_000_000)).hexdigest()
        # A webhook: method, headers and JSON body arrive; status and body come back
        hook = {"url": f"{server.url}/echo", "method": "PATCH", "headers": {"X-Job": "42"}, "body": {"ok": True}}
        answer = succeeded(control_plane, "webhook", hook)
        assert answer["status"] == 200 and '"method": "PATCH"' in answer["body"]
        seen = [r for r in server.requests if r.path == "/echo"][-1]
        assert seen.headers["X-Job"] == "42" and seen.body == b'{"ok":true}'
        # A 503 is a retryable failure: the second attempt succeeds
        flaky = wait_done(
            control_plane, submit(control_plane, "webhook", {"url": f"{server.url}/flaky/1"}, max_attempts=2).id
        )
        assert (flaky.state, flaky.attempts) == (S.SUCCEEDED, 2) and result(flaky)["status"] == 200
        # A status >= 400 on every attempt ends FAILED with the status in the error
        bad = wait_done(
            control_plane, submit(control_plane, "webhook", {"url": f"{server.url}/status/500"}, max_attempts=1).id
        )
        assert (bad.state, bad.error.code) == (S.FAILED, "HTTP_ERROR") and "status 500" in bad.error.message
    refused = {"url": f"http://127.0.0.1:{free_port()}/hook", "timeout_sec": 2}
    down = wait_done(control_plane, submit(control_plane, "webhook", refused, max_attempts=1).id)
    assert (down.state, down.error.code) == (S.FAILED, "NETWORK_ERROR")
    io = succeeded(control_plane, "io_intensive", {"size_bytes": 5_000_000, "seed": 2})
    assert (
        io["bytes"] == 5_000_000
        and io["sha256"] == local("io_intensive", {"size_bytes": 5_000_000, "seed": 2})["sha256"]
    )


def test_email_through_a_worker_configured_for_a_local_smtp_server(
    control_plane: ControlProc, spawn_worker: Any
) -> None:
    with local_smtp() as smtp:
        spawn_worker(control_plane, env={"CORRAL_SMTP_HOST": smtp.host, "CORRAL_SMTP_PORT": str(smtp.port)})
        out = succeeded(control_plane, "email", {"to": ["ops@example.test"], "subject": "Nightly", "body": "42 jobs"})
        assert out["accepted"] == ["ops@example.test"]
        [(_, rcpts, message)] = smtp.messages
        assert rcpts == ["ops@example.test"] and message["Subject"] == "Nightly"
        assert message["Message-ID"] == out["message_id"]


def test_email_without_a_server_is_a_clear_failure(control_plane: ControlProc, spawn_worker: Any) -> None:
    spawn_worker(control_plane, env={"CORRAL_SMTP_HOST": "127.0.0.1", "CORRAL_SMTP_PORT": str(free_port())})
    done = wait_done(
        control_plane,
        submit(control_plane, "email", {"to": "a@b.test", "subject": "s", "body": "b"}, max_attempts=1).id,
    )
    assert (done.state, done.error.code) == (S.FAILED, "SMTP_ERROR")


# -- bad payloads are refused at submit, naming the field ---------------------------------------------------


NPY = encode_npy(np.arange(3, dtype=np.int64))
BAD: list[tuple[str, dict[str, Any], str]] = [
    ("sleep", {"seconds": -1}, "payload.seconds"),
    ("add_numbers", {"a": 1, "b": 1.5}, "payload.b"),
    ("add_numbers", {"a": 2**53 + 2, "b": 1}, "payload.a"),  # a double holds it, but maybe rounded from 2**53+1
    ("add_numbers", {"a": math.inf, "b": 1}, "payload.a"),
    ("large_array_sum", {"numbers": [1.0, math.nan], "dtype": "float64"}, "payload.numbers[1]"),
    ("reverse_string", {"text": 5}, "payload.text"),
    ("large_array_sum", {}, "payload"),
    ("large_array_sum", {"numbers": [1], "array_b64": NPY}, "payload"),
    ("large_array_sum", {"numbers": [1, 2.5]}, "payload.numbers[1]"),
    ("large_array_sum", {"numbers": [2**64]}, "payload.numbers[0]"),
    ("large_array_sum", {"numbers": ["x"], "dtype": "float64"}, "payload.numbers[0]"),
    ("large_array_sum", {"array_b64": "not base64!"}, "payload.array_b64"),
    ("large_array_sum", {"array_b64": "QUJDRA=="}, "payload.array_b64"),
    ("large_array_sum", {"numbers": [1], "dtype": "int32"}, "payload.dtype"),
    ("large_array_sum", {"numbers": [1], "on_overflow": "wrap"}, "payload.on_overflow"),
    ("resize_image", {"width": 4, "height": 4, "target_width": 0, "target_height": 2}, "payload.target_width"),
    ("resize_image", {"width": 4, "target_width": 2, "target_height": 2}, "payload"),
    (
        "resize_image",
        {"width": 4, "height": 4, "channels": 2, "target_width": 2, "target_height": 2},
        "payload.channels",
    ),
    ("resize_image", {"png_b64": "iVBORw0KGgo=", "width": 4, "target_width": 2, "target_height": 2}, "payload.width"),
    ("resize_image", {"png_b64": "R0lGODlh", "target_width": 2, "target_height": 2}, "payload.png_b64"),
    (
        "resize_image",
        {"width": 4, "height": 4, "target_width": 2, "target_height": 2, "method": "cubic"},
        "payload.method",
    ),
    ("cpu_intensive", {"n": 0}, "payload.n"),
    ("cpu_intensive", {"n": 10, "rounds": 10}, "payload"),
    ("cpu_intensive", {"seed": 1, "n": 10}, "payload"),
    ("cpu_intensive", {"rounds": -1}, "payload.rounds"),
    ("matmul", {"n": 9000}, "payload.n"),
    ("matmul", {"a_b64": NPY}, "payload"),
    ("matmul", {"n": 4, "seed": 2**60}, "payload.seed"),
    ("monte_carlo_pi", {"samples": 0}, "payload.samples"),
    ("monte_carlo_pi", {"samples": 10, "seed": -1}, "payload.seed"),
    ("io_intensive", {"size_bytes": -1}, "payload.size_bytes"),
    ("io_intensive", {"size_bytes": 1, "block_bytes": 1}, "payload.block_bytes"),
    ("network_intensive", {"url": "file:///etc/passwd"}, "payload.url"),
    ("network_intensive", {"url": "http://127.0.0.1/", "timeout_sec": 0}, "payload.timeout_sec"),
    ("webhook", {"url": "http://127.0.0.1/", "method": "TRACE"}, "payload.method"),
    ("webhook", {"url": "http://127.0.0.1/", "headers": {"X-A": "1\r\nX-B: 2"}}, "payload.headers.X-A"),
    ("webhook", {"url": "http://127.0.0.1/", "headers": {"bad header": "1"}}, "payload.headers"),
    ("webhook", {"method": "POST"}, "payload"),
    ("email", {"to": "nobody", "subject": "s", "body": "b"}, "payload.to"),
    ("email", {"to": ["a@b.test"], "subject": "s\r\nBcc: x@y.test", "body": "b"}, "payload.subject"),
    ("email", {"to": [], "subject": "s", "body": "b"}, "payload.to"),
    ("email", {"to": "a@b.test", "body": "b"}, "payload"),
    ("failing", {"fail_attempts": -1}, "payload.fail_attempts"),
]


@pytest.mark.parametrize(("job_type", "payload", "field"), BAD, ids=[f"{t}:{f}:{i}" for i, (t, _, f) in enumerate(BAD)])
def test_bad_payloads_are_refused_at_submit_naming_the_field(
    refusing_control_plane: ControlProc, job_type: str, payload: dict[str, Any], field: str
) -> None:
    cp = refusing_control_plane  # shared by the cases: each leaves it with no job stored, and checks that
    err = rpc_error(cp.jobs.SubmitJob, request(job_type, payload))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert field_of(err) == field, err.details()  # type: ignore[attr-defined]
    assert (err.details() or "").startswith(field)  # type: ignore[attr-defined]
    assert int(cp.jobs.ListJobs(jobs_pb2.ListJobsRequest(limit=1)).total) == 0


def test_every_builtin_type_has_a_bad_payload_case() -> None:
    from corral.jobtypes import BUILTIN_SCHEMAS

    assert {t for t, _, _ in BAD} == set(BUILTIN_SCHEMAS) - {"noop"}  # noop takes any object


# -- kills, limits and cores, seen from outside the worker ---------------------------------------------------


def _runner_pids(worker: Any) -> list[int]:
    return children(worker.proc.pid)


@pytest.mark.serial  # times a bound in milliseconds: beside other tests it would time their load
def test_a_kernel_job_killed_at_its_timeout_leaves_no_process_and_the_worker_keeps_serving(
    control_plane: ControlProc, spawn_worker: Any
) -> None:
    # Given a worker with one slot and two threads, and its one runner process
    worker = spawn_worker(control_plane, threads=2, slots=1)
    [runner] = wait_until(lambda: _runner_pids(worker), what="the runner process")
    # When a two-thread kernel job that would run for minutes reaches its 0.5 s timeout
    job = submit(control_plane, "cpu_intensive", {"rounds": 10**10}, thread_demand=2, timeout_sec=0.5, max_attempts=1)
    wait_until(lambda: control_plane.get(job.id).state == S.RUNNING, what="the job to start")
    wait_until(lambda: not alive(runner), timeout=5, interval=0.002, what="the runner to die")
    died = time.time()
    done = wait_done(control_plane, job.id)
    # Then it is reported TIMEOUT, its process (all its threads) is gone at the deadline
    assert (done.state, done.error.code) == (S.FAILED, "TIMEOUT")
    assert died - (done.started_at.ToNanoseconds() / 1e9 + 0.5) <= 0.25
    assert not os.path.exists(f"/proc/{runner}")
    # And a fresh runner takes its place, and the worker serves the next job
    replacement = wait_until(lambda: [p for p in _runner_pids(worker) if p != runner], what="a replacement runner")
    assert len(replacement) == 1 and len(_runner_pids(worker)) == 1
    assert succeeded(control_plane, "cpu_intensive", {"n": 1000}, thread_demand=2) == {"primes": 168}


def test_the_memory_limit_fails_the_job_and_the_worker_keeps_its_runners(
    control_plane: ControlProc, spawn_worker: Any
) -> None:
    worker = spawn_worker(control_plane, threads=2, slots=2, env={"CORRAL_JOB_MEMORY_LIMIT_MB": "64"})
    wait_until(lambda: len(_runner_pids(worker)) == 2, what="two runners")
    done = wait_done(control_plane, submit(control_plane, "matmul", {"n": 6000}, max_attempts=1).id)
    assert (done.state, done.error.code) == (S.FAILED, "MEMORY_LIMIT")
    assert "64 MiB" in done.error.message
    wait_until(lambda: len(_runner_pids(worker)) == 2, what="the pool back at two runners")
    assert succeeded(control_plane, "matmul", {"n": 100})["rows"] == 100


def _cpu_by_thread(pid: int) -> dict[int, float]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / TICK
    return out


@pytest.mark.serial  # two cores of its own: beside other tests it would measure their load
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores")
def test_thread_demand_two_uses_two_cores_in_the_runner(control_plane: ControlProc, spawn_worker: Any) -> None:
    worker = spawn_worker(control_plane, threads=2, slots=1)
    [runner] = wait_until(lambda: _runner_pids(worker), what="the runner process")
    best = 0.0
    for _ in range(3):  # a machine busy with something else can slow one run
        before = _cpu_by_thread(runner)
        # About 1.3 s of two threads' work: CPU time is counted in 10 ms ticks, and the threads' start and
        # the wait for the slower one are fixed costs; with a third of it (0.45 s) those alone put a run
        # at 1.68-1.83, so that all three fell under the bound now and then (CI once, twice in 7 here).
        done = wait_done(
            control_plane, submit(control_plane, "cpu_intensive", {"rounds": 36_000_000}, thread_demand=2).id
        )
        after = _cpu_by_thread(runner)
        used = sorted((after[t] - before.get(t, 0.0) for t in after), reverse=True)
        assert done.threads_granted == 2 and done.state == S.SUCCEEDED
        assert min(used[:2]) >= 0.3 * sum(used), f"two threads did the work: {used}"
        best = max(best, sum(used) / done.exec_seconds)
        if best >= 1.7:
            break
    assert best >= 1.7, f"CPU time was only {best:.2f}x the job's wall time"


def test_an_entry_point_job_type_is_advertised_and_runs(
    control_plane: ControlProc, spawn_worker: Any, tmp_path: Path
) -> None:
    site = make_plugin_distribution(tmp_path)
    spawn_worker(control_plane, env={"PYTHONPATH": f"{site}{os.pathsep}{ROOT}"})
    assert succeeded(control_plane, "demo_shout", {"text": "hi"}, thread_demand=1) == {"shout": "HI", "threads": 1}
    err = rpc_error(control_plane.jobs.SubmitJob, request("demo_shout", {"text": 5}))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]


def test_an_empty_result_is_a_result_on_every_surface(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given a noop job, whose result is {}, succeeded
    spawn_worker(control_plane)
    job = submit(control_plane, "noop")
    done = wait_done(control_plane, job.id)
    assert done.state == S.SUCCEEDED

    # Then gRPC, REST and the Python client all give {} (the result was left out, None in Python),
    # while an unfinished job still has none
    assert done.HasField("result") and not done.result.fields
    reply = Rest(http_port(control_plane)).get(f"/v1/jobs/{job.id}")
    assert reply.status == 200 and reply.json()["result"] == {}, reply.body
    with Client(control_plane.address) as client:
        assert client.get(job.id).result == {}
        pending = client.submit("sleep", {"seconds": 30})
        assert client.get(pending.id).result is None
        client.cancel(pending.id)
