"""Control-plane faults: restart under load, kill -9 with 1,000 accepted jobs, SIGTERM mid-call."""

from __future__ import annotations

import json
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import timestamp_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from corral.v1 import jobs_pb2
from tests.conftest import ROOT, ControlProc, base_env, wait_until
from tests.support.calls import executions, request, submit, submit_many, wait_all_done

S = jobs_pb2.Job


def _counts(cp: ControlProc) -> dict[str, int]:
    stats = cp.jobs.GetStats(jobs_pb2.GetStatsRequest(), timeout=10)
    return dict(stats.jobs_by_status)


@pytest.mark.slow
def test_restart_with_running_jobs_reruns_nothing(
    control_plane: ControlProc, spawn_worker: Any, tmp_path: Path
) -> None:
    # Given 200 long jobs spread over workers that stay up
    log = tmp_path / "runs.log"
    for _ in range(4):
        spawn_worker(control_plane, threads=10)
    jobs = submit_many(control_plane, [request("record", {"path": str(log), "seconds": 1.5}) for _ in range(200)])
    wait_until(lambda: len(executions(log)) >= 40, what="40 jobs to be running")
    # When the control plane is stopped with SIGTERM and started again
    assert control_plane.stop(signal.SIGTERM) == 0
    control_plane.start()
    done = wait_all_done(control_plane, [j.id for j in jobs], timeout=120)
    # Then every job succeeded under its first attempt, and each ran exactly once
    assert {(j.state, j.attempts) for j in done} == {(S.SUCCEEDED, 1)}
    runs = Counter(job_id for job_id, _ in executions(log))
    assert len(runs) == 200
    assert set(runs.values()) == {1}


@pytest.mark.slow
def test_kill_9_loses_no_accepted_job(control_plane: ControlProc, spawn_worker: Any, tmp_path: Path) -> None:
    # Given 1,000 accepted jobs: some running, most queued, some scheduled for later
    log = tmp_path / "runs.log"
    for _ in range(2):
        spawn_worker(control_plane, threads=4)
    later = timestamp_pb2.Timestamp()
    later.FromNanoseconds(int((time.time() + 2) * 1e9))
    reqs = [request("record", {"path": str(log), "seconds": 0.01}) for _ in range(900)]
    reqs += [request("record", {"path": str(log), "seconds": 0.01}, scheduled_at=later) for _ in range(100)]
    jobs = submit_many(control_plane, reqs)
    assert len(jobs) == 1000
    wait_until(lambda: len(executions(log)) >= 50, what="some jobs to run")
    # When the control plane is killed with SIGKILL mid-stream and restarted
    control_plane.kill()
    before_restart = Counter(job_id for job_id, _ in executions(log))
    control_plane.start()
    # Then all 1,000 succeed: none lost
    done = wait_all_done(control_plane, [j.id for j in jobs], timeout=180)
    assert Counter(j.state for j in done) == {S.SUCCEEDED: 1000}
    runs = Counter(job_id for job_id, _ in executions(log))
    assert set(runs) == {j.id for j in jobs}
    # and a job ran twice only if it had started before the kill (it was running then)
    reruns = {job_id for job_id, n in runs.items() if n > 1}
    assert reruns <= set(before_restart), (
        f"re-run jobs that had not started before the kill: {reruns - set(before_restart)}"
    )
    print(f"\nkill -9 with 1,000 jobs: {len(before_restart)} had started, {len(reruns)} re-ran")


def test_kill_9_right_after_large_batches_are_acknowledged_loses_none_of_them(
    control_plane: ControlProc, spawn_worker: Any, tmp_path: Path
) -> None:
    # Given workers taking jobs while two batches of 2,500 (each one transaction on the store's writer
    # thread, with the results and leases of the running jobs committed between and after them) go in
    log = tmp_path / "runs.log"
    spawn_worker(control_plane, threads=4)
    first = submit_many(control_plane, [request("record", {"path": str(log)}) for _ in range(2_500)])
    second = submit_many(
        control_plane, [request("record", {"path": str(log)}, labels={"b": "2"}) for _ in range(2_500)]
    )
    # When the control plane is killed with SIGKILL the moment the second answer arrives
    control_plane.kill()
    before_restart = Counter(job_id for job_id, _ in executions(log))
    control_plane.start()
    spawn_worker(control_plane, threads=4)
    # Then every acknowledged job is there and succeeds, and a job ran twice only if it had run before
    ids = [j.id for j in first + second]
    done = wait_all_done(control_plane, ids, timeout=180)
    assert Counter(j.state for j in done) == {S.SUCCEEDED: 5_000}
    runs = Counter(job_id for job_id, _ in executions(log))
    assert set(runs) == set(ids)
    reruns = {job_id for job_id, n in runs.items() if n > 1}
    assert reruns <= set(before_restart), (
        f"re-run jobs that had not run before the kill: {reruns - set(before_restart)}"
    )
    labelled = control_plane.jobs.ListJobs(jobs_pb2.ListJobsRequest(labels={"b": "2"}, limit=1), timeout=10)
    assert labelled.total == 2_500


def test_sigterm_lets_in_flight_submissions_finish(control_plane: ControlProc) -> None:
    # Given a client submitting batches as fast as it can
    acked: list[str] = []
    errors: list[grpc.StatusCode] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            try:
                resp = control_plane.jobs.SubmitJobs(
                    jobs_pb2.SubmitJobsRequest(jobs=[request("noop") for _ in range(200)]), timeout=10
                )
                acked.extend(j.id for j in resp.jobs)
            except grpc.RpcError as err:
                errors.append(err.code())
                return

    t = threading.Thread(target=client)
    t.start()
    wait_until(lambda: len(acked) >= 1000, what="submissions to flow")
    # When the control plane gets SIGTERM
    assert control_plane.stop(signal.SIGTERM) == 0
    stop.set()
    t.join(30)
    # Then, after a restart, every acknowledged job is there, and only whole batches were stored
    control_plane.start()
    stored = control_plane.jobs.ListJobs(jobs_pb2.ListJobsRequest(limit=1), timeout=10).total
    assert stored >= len(acked)
    assert stored % 200 == 0
    for job_id in acked[-5:]:
        assert control_plane.get(job_id).state == S.PENDING
    assert set(errors) <= {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
    assert _counts(control_plane)["PENDING"] == stored


def test_an_idle_corral_client_does_not_hold_up_a_graceful_stop(make_control_plane: Any) -> None:
    # A long grace, so that anything waiting on the idle connection would show; the client is a
    # program of its own that imports corral first (as the CLI and user programs do), made one call
    # and sits idle on its connection.
    cp = make_control_plane(CORRAL_SHUTDOWN_GRACE_SEC="10")
    took = []
    for _ in range(3):  # an unserviced idle connection costs 0-5 s at random: three stops all but rule it out
        client = subprocess.Popen(
            [sys.executable, "-c", f"import corral, time; c = corral.Client('{cp.address}'); c.stats(); print(1, flush=True);"
             " time.sleep(120)"],
            cwd=ROOT, env=base_env(), stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert client.stdout is not None and client.stdout.readline().strip() == "1"
            started = time.monotonic()
            assert cp.stop() == 0
            took.append(time.monotonic() - started)
        finally:
            client.kill()
            client.wait(10)
        cp.start()
    assert max(took) < 1.5, f"graceful stops took {[round(t, 2) for t in took]} s with only an idle client connected"


def test_a_stop_ends_open_watches_with_unavailable_instead_of_waiting_out_the_grace(
    make_control_plane: Any, spawn_worker: Any
) -> None:
    cp = make_control_plane(CORRAL_SHUTDOWN_GRACE_SEC="10")
    spawn_worker(cp, threads=1, imports=())
    job = cp.jobs.SubmitJob(request("sleep", {"seconds": 60}), timeout=10).job
    stream = cp.jobs.WatchJob(jobs_pb2.WatchJobRequest(id=job.id), timeout=60)
    first = next(stream)  # open, the job as it is now
    events: list[jobs_pb2.JobEvent] = [first]
    ended: list[grpc.RpcError] = []

    def read() -> None:  # keeps reading, as a client waiting for the job's end does
        try:
            events.extend(stream)
        except grpc.RpcError as err:
            ended.append(err)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    started = time.monotonic()
    assert cp.stop() == 0
    took = time.monotonic() - started
    reader.join(10)
    assert ended, f"the watch did not fail: {[S.State.Name(e.job.state) for e in events]}"
    err: Any = ended[0]
    assert err.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in err.details()
    assert all(e.job.state != S.SUCCEEDED for e in events)  # the job goes on, on its worker
    assert took < 5, f"the stop took {took:.1f} s with one watch open (the grace is 10 s)"


def test_a_stop_ends_an_open_rest_watch_with_an_error_line_at_once(make_control_plane: Any, spawn_worker: Any) -> None:
    cp = make_control_plane(CORRAL_SHUTDOWN_GRACE_SEC="10")
    spawn_worker(cp, threads=1, imports=())
    job = cp.jobs.SubmitJob(request("sleep", {"seconds": 60}), timeout=10).job
    lines: list[dict[str, Any]] = []
    opened = threading.Event()

    def read() -> None:
        url = f"http://127.0.0.1:{cp.http_port}/v1/jobs/{job.id}:watch"
        with urllib.request.urlopen(url, timeout=60) as reply:  # a REST client streaming the job's changes
            for line in reply:
                lines.append(json.loads(line))
                opened.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert opened.wait(10), "the REST watch sent nothing"
    started = time.monotonic()
    assert cp.stop() == 0
    took = time.monotonic() - started
    reader.join(10)
    assert "result" in lines[0]
    assert lines[-1]["error"]["code"] == 14 and "shutting down" in lines[-1]["error"]["message"]  # 14: UNAVAILABLE
    assert took < 5, f"the stop took {took:.1f} s with one REST watch open (the grace is 10 s)"


def test_a_stop_ends_open_health_watches_after_telling_them_not_serving(make_control_plane: Any) -> None:
    # A gRPC client with client-side health checking (healthCheckConfig) keeps a Health/Watch open; it
    # must hear NOT_SERVING and see the stream end, not hold the stop for the grace.
    cp = make_control_plane(CORRAL_SHUTDOWN_GRACE_SEC="10")
    stub = health_pb2_grpc.HealthStub(cp.channel())
    seen: dict[str, list[int]] = {"": [], "corral.v1.JobService": []}
    ended: dict[str, grpc.RpcError] = {}
    opened = threading.Barrier(3)

    def watch(service: str) -> None:
        stream = stub.Watch(health_pb2.HealthCheckRequest(service=service), timeout=60)
        try:
            for reply in stream:
                seen[service].append(reply.status)
                if len(seen[service]) == 1:
                    opened.wait(10)
        except grpc.RpcError as err:
            ended[service] = err

    readers = [threading.Thread(target=watch, args=(s,), daemon=True) for s in seen]
    for reader in readers:
        reader.start()
    opened.wait(10)
    started = time.monotonic()
    assert cp.stop() == 0
    took = time.monotonic() - started
    for reader in readers:
        reader.join(10)
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    assert seen[""][0] == health_pb2.HealthCheckResponse.SERVING and seen[""][-1] == not_serving, seen
    assert seen["corral.v1.JobService"][-1] == not_serving, seen
    for service, err in ended.items():
        assert err.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in (err.details() or ""), service  # type: ignore[attr-defined]
    assert set(ended) == set(seen), f"streams left open: {set(seen) - set(ended)}"
    assert took < 5, f"the stop took {took:.1f} s with two health watches open (the grace is 10 s)"


def _start_control(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``python -m control`` that is expected not to start; its exit code and output."""
    return subprocess.run(
        [sys.executable, "-m", "control", *args],
        cwd=ROOT,
        env=base_env(env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_second_control_plane_on_the_same_database_refuses_to_start(
    control_plane: ControlProc, spawn_worker: Any, tmp_path: Path
) -> None:
    # Given a control plane with 20 jobs queued or running on its one-slot worker
    log = tmp_path / "runs.log"
    spawn_worker(control_plane, threads=1, imports=("tests.support.jobtypes",))
    reqs = [request("record", {"path": str(log), "seconds": 0.05}) for _ in range(20)]
    ids = [job.id for job in submit_many(control_plane, reqs)]
    assert control_plane.proc is not None
    holder = control_plane.proc.pid

    # When a second one is started on the same database (a second `corral up` in another terminal):
    # before, it started, loaded the same queued jobs and would have run each of them a second time
    second = _start_control(
        "--grpc-port", "0", "--http-port", "0", "--db", str(control_plane.db), env=control_plane.env
    )

    # Then it refuses, naming the database, the holder and the setting
    assert second.returncode == 1, second.stderr
    said = second.stderr.strip().splitlines()[-1]
    assert said == (
        f"corral control: cannot start: the database {control_plane.db} is in use by another control plane "
        f"(pid {holder}): stop that one first, or give this one a database of its own (CORRAL_DB, --db)"
    )
    # and the first goes on: every job runs once
    wait_all_done(control_plane, ids)
    assert sorted(executions(log)) == sorted((job_id, 1) for job_id in ids)

    # After kill -9 of the holder the kernel has dropped its lock: the next control plane starts at once
    control_plane.kill()
    control_plane.start()
    assert _counts(control_plane)["SUCCEEDED"] == 20


@pytest.mark.parametrize("which", ["grpc", "http"])
def test_a_port_in_use_stops_start_up_with_one_line_naming_the_setting(tmp_path: Path, which: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        ports = (
            ["--grpc-port", port, "--http-port", "0"] if which == "grpc" else ["--grpc-port", "0", "--http-port", port]
        )
        done = _start_control(*ports, "--db", str(tmp_path / "c.db"), env={})
    assert done.returncode == 1, done.stderr
    said = done.stderr.strip().splitlines()[-1]
    assert said.startswith(
        f"corral control: cannot start: cannot {'listen on' if which == 'grpc' else 'serve HTTP on'}"
    )
    assert said.endswith(f"(CORRAL_{which.upper()}_PORT, --{which}-port)"), said
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr


def test_a_store_that_cannot_be_written_stops_the_control_plane_and_a_restart_loses_nothing(
    control_plane: ControlProc, spawn_worker: Any
) -> None:
    cp = control_plane
    spawn_worker(cp, threads=2)
    assert cp.proc is not None
    # Given a store with about 300 KB left to grow: RLIMIT_FSIZE makes the kernel refuse to write its
    # files past that size, as a full disk does (a test cannot fill a shared machine's disk)
    files = [*cp.workdir.glob("corral.db*"), cp.log]
    limit = max(f.stat().st_size for f in files) + 300_000
    resource.prlimit(cp.proc.pid, resource.RLIMIT_FSIZE, (limit, limit))
    # When jobs keep coming
    acked: list[str] = []
    refused: grpc.RpcError | None = None
    for _ in range(500):
        try:
            acked.append(cp.jobs.SubmitJob(request("reverse_string", {"text": "x" * 20_000}), timeout=10).job.id)
        except grpc.RpcError as err:
            refused = err
            break
    # Then a submission is refused, saying why (before: the control plane stayed up for good, unready,
    # its memory ahead of its store, and even a disk with room again did not bring it back)
    assert refused is not None and refused.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    assert "store cannot be written" in (refused.details() or "")  # type: ignore[attr-defined]
    # and the control plane stops, exit status 3, with one line that says what to do
    assert cp.proc.wait(30) == 3
    assert "corral control: the store cannot be written" in cp.log.read_text()
    cp.proc = None
    # And once the store can be written again, a restart has every acknowledged job, each run once
    cp.start()
    done = wait_all_done(cp, acked)
    assert {(j.state, j.attempts) for j in done} == {(S.SUCCEEDED, 1)}
    assert all(j.result["reversed"] == "x" * 20_000 for j in done)
    assert cp.jobs.ListJobs(jobs_pb2.ListJobsRequest(limit=1), timeout=10).total == len(acked)


@pytest.mark.slow
def test_a_control_plane_that_stood_still_reaps_no_worker_and_expires_no_lease(
    control_plane: ControlProc, spawn_worker: Any, tmp_path: Path
) -> None:
    cp = control_plane
    assert cp.proc is not None
    log = tmp_path / "runs.log"
    workers = {spawn_worker(cp, threads=1).worker_id for _ in range(2)}
    # Given two jobs running, one of them with a lease that ends 3 + 2 (grace) s after it started
    jobs = [
        submit(cp, "record", {"path": str(log), "seconds": 1.0}, timeout_sec=3),
        submit(cp, "record", {"path": str(log), "seconds": 1.0}),
    ]
    wait_until(lambda: len(executions(log)) == 2, what="both jobs to start")
    # When the control plane stands still for 6 s (SIGSTOP: a frozen container or VM, a blocked event
    # loop), three heartbeat timeouts and past that lease's end, while its workers go on
    cp.proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(6.0)  # the fault itself: how long the process stands still
    finally:
        cp.proc.send_signal(signal.SIGCONT)
    done = wait_all_done(cp, [j.id for j in jobs], timeout=30)
    # Then no worker was lost and no lease expired: both jobs succeeded on their first attempt, each run
    # once (before: on waking, the reaper judged the heartbeats waiting unread in its sockets as silence,
    # removed both workers, failed both jobs WORKER_LOST and ran them again)
    assert [(j.state, j.attempts) for j in done] == [(S.SUCCEEDED, 1)] * 2
    assert Counter(job_id for job_id, _ in executions(log)) == {j.id: 1 for j in jobs}
    assert {w.id for w in cp.workers()} == workers
    assert cp.events("worker_stale") == [] and cp.events("lease_expired") == []
    (paused,) = cp.events("control_paused")
    assert 5.0 <= paused["seconds"] <= 7.0 and paused["workers"] == 2 and paused["leases"] == 2


def test_a_job_type_a_worker_registered_survives_a_kill_9_right_after(
    control_plane: ControlProc, spawn_worker: Any
) -> None:
    # Given a worker that registered a plug-in's job type, and then went away with the control plane,
    # both killed right after (nothing else was committed in between)
    worker = spawn_worker(control_plane)
    worker.kill()
    control_plane.kill()
    # When the control plane starts again, with no worker at all
    control_plane.start()
    # Then it still knows the type: a job of it is accepted and waits for a worker that runs it
    job = submit(control_plane, "record", {"path": "/dev/null", "seconds": 0})
    assert job.state == S.PENDING
