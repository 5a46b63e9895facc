"""Scheduling through the real control plane and real workers: every job type, round-robin,
thread-aware placement, priorities, scheduled_at, cancel."""

from __future__ import annotations

import base64
import hashlib
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import timestamp_pb2

from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, wait_until
from tests.support.calls import executions, request, result, submit, submit_many, wait_all_done, wait_done, watch
from tests.support.processes import alive

S = jobs_pb2.Job


def test_every_builtin_type_end_to_end(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given one worker
    spawn_worker(control_plane, threads=2)
    pixels = bytes(range(48))  # 4x4 RGB
    cases: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = [
        ("noop", {}, {}),
        ("sleep", {"seconds": 0.05}, None),
        ("add_numbers", {"a": 2**40, "b": -7}, {"sum": 2**40 - 7}),
        # Beyond 2**53 a Struct's double rounds the number; the text is exact.
        ("add_numbers", {"a": 2**53, "b": 2**53 - 1}, {"sum": 2**54, "sum_text": str(2**54 - 1)}),
        ("reverse_string", {"text": "añb𝄞c"}, {"reversed": "c𝄞bña"}),
        ("large_array_sum", {"numbers": list(range(1000))}, {"sum": 499500}),
        ("cpu_intensive", {"n": 100}, {"primes": 25}),
        ("failing", {"fail_attempts": 0}, None),
        (
            "resize_image",
            {"width": 4, "height": 4, "channels": 3, "target_width": 2, "target_height": 2,
             "method": "area", "pixels_b64": base64.b64encode(pixels).decode()},
            None,
        ),
    ]  # fmt: skip
    # When each is submitted and watched to the end
    for type_, payload, expected in cases:
        events = watch(control_plane, submit(control_plane, type_, payload).id)
        # Then it passes through RUNNING to SUCCEEDED with the right result
        assert [e.state for e in events][-1] == S.SUCCEEDED, (type_, events[-1].error)
        assert S.RUNNING in [e.state for e in events] or events[0].state == S.SUCCEEDED
        done = events[-1]
        if expected is not None:
            assert result(done) == expected, type_
        assert done.attempts == 1
        assert done.total_seconds >= done.exec_seconds >= 0
    resized = result(
        wait_done(control_plane, submit(control_plane, "resize_image", cases[-1][1] | {"return_pixels": True}).id)
    )
    out = np.frombuffer(base64.b64decode(resized["pixels_b64"]), dtype=np.uint8).reshape(2, 2, 3)
    ref = np.frombuffer(pixels, dtype=np.uint8).reshape(4, 4, 3).astype(float).reshape(2, 2, 2, 2, 3).mean(axis=(1, 3))
    assert np.abs(out.astype(float) - ref).max() <= 1
    assert resized["checksum"] == hashlib.sha256(out.tobytes()).hexdigest()


def test_round_robin_rotates_over_one_slot_workers(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given three one-slot workers
    ids = [spawn_worker(control_plane, threads=1).worker_id for _ in range(3)]
    # When 30 jobs arrive one after the other
    order = [wait_done(control_plane, submit(control_plane, "noop").id).worker_id for _ in range(30)]
    # Then each worker runs 10, in rotation
    assert Counter(order) == {w: 10 for w in ids}
    assert all(order[i] != order[i + 1] for i in range(29))
    assert order[3:] == (order[:3] * 10)[3:]


def test_round_robin_spreads_a_burst_evenly(control_plane: ControlProc, spawn_worker: Any) -> None:
    ids = [spawn_worker(control_plane, threads=1).worker_id for _ in range(3)]
    jobs = submit_many(control_plane, [request("sleep", {"seconds": 0.1}) for _ in range(30)])
    done = wait_all_done(control_plane, [j.id for j in jobs])
    assert Counter(j.worker_id for j in done) == {w: 10 for w in ids}


def test_thread_demand_places_on_a_worker_with_enough_threads(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given workers with 4 and 8 threads
    small = spawn_worker(control_plane, threads=4).worker_id
    big = spawn_worker(control_plane, threads=8).worker_id
    # When jobs ask for 8 threads, for 16, and for 2
    eights = [submit(control_plane, "noop", thread_demand=8) for _ in range(6)]
    sixteen = submit(control_plane, "noop", thread_demand=16)
    twos = [submit(control_plane, "sleep", {"seconds": 0.05}, thread_demand=2) for _ in range(8)]
    # Then 8-thread jobs run only on the big worker, 16 runs with 8 and says so
    for job in eights:
        done = wait_done(control_plane, job.id)
        assert (done.worker_id, done.threads_granted) == (big, 8)
    done16 = wait_done(control_plane, sixteen.id)
    assert (done16.state, done16.worker_id, done16.thread_demand, done16.threads_granted) == (S.SUCCEEDED, big, 16, 8)
    placed = {wait_done(control_plane, j.id).worker_id for j in twos}
    assert placed <= {small, big}


def test_queued_jobs_start_by_priority_then_age(control_plane: ControlProc, spawn_worker: Any, tmp_path: Path) -> None:
    # Given the only worker busy
    spawn_worker(control_plane, threads=1)
    log = tmp_path / "order.log"
    hold = tmp_path / "hold"  # the blocker runs until this exists, however slowly the jobs queue up
    blocker = submit(control_plane, "chatty", {"lines": 0, "hold": str(hold)})
    wait_until(lambda: control_plane.get(blocker.id).state == S.RUNNING, what="blocker to run")
    # When jobs of mixed priority queue up behind it
    prios = [0, 50, 10, 50, 100, 0, 10]
    queued = [submit(control_plane, "record", {"path": str(log)}, priority=p) for p in prios]
    hold.touch()
    wait_all_done(control_plane, [j.id for j in queued])
    # Then they ran by priority, oldest first within a priority
    ran = [job_id for job_id, _ in executions(log)]
    expected = [
        j.id
        for _, _, j in sorted(
            ((-p, i, j) for i, (p, j) in enumerate(zip(prios, queued, strict=True))), key=lambda t: t[:2]
        )
    ]
    assert ran == expected


def test_with_priority_aging_a_long_wait_outranks_a_small_priority_gap(
    make_control_plane: Any, spawn_worker: Any, tmp_path: Path
) -> None:
    # Given one priority level for each second waited, and the only worker busy
    control_plane = make_control_plane(CORRAL_PRIORITY_AGING_SEC=1)
    spawn_worker(control_plane, threads=1)
    log = tmp_path / "order.log"
    blocker = submit(control_plane, "record", {"path": str(log), "seconds": 60})
    wait_until(lambda: control_plane.get(blocker.id).state == S.RUNNING, what="blocker to run")
    # When a priority-0 job has waited more than three seconds, and two more jobs then queue up
    old = submit(control_plane, "record", {"path": str(log)})
    waited_from = old.created_at.ToNanoseconds() / 1e9
    wait_until(lambda: time.time() > waited_from + 3.5, timeout=10, what="three levels' worth of waiting")
    small = submit(control_plane, "record", {"path": str(log)}, priority=2)
    big = submit(control_plane, "record", {"path": str(log)}, priority=50)
    control_plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=blocker.id))
    wait_all_done(control_plane, [old.id, small.id, big.id])
    # Then a large priority gap still wins, but the old job goes before the small gap that just came
    ran = [job_id for job_id, _ in executions(log)][1:]
    assert ran == [big.id, old.id, small.id]


def test_scheduled_job_does_not_start_before_its_time(control_plane: ControlProc, spawn_worker: Any) -> None:
    spawn_worker(control_plane, threads=1)
    at = time.time() + 1.5
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(at * 1e9))
    job = submit(control_plane, "noop", scheduled_at=ts)
    assert job.state == S.SCHEDULED
    done = wait_done(control_plane, job.id)
    assert done.state == S.SUCCEEDED
    assert done.started_at.ToNanoseconds() / 1e9 >= at


def test_cancel_a_queued_job_never_runs_it(control_plane: ControlProc, spawn_worker: Any, tmp_path: Path) -> None:
    spawn_worker(control_plane, threads=1)
    log = tmp_path / "runs.log"
    hold = tmp_path / "hold"  # the blocker holds the only slot until the victim is cancelled
    blocker = submit(control_plane, "chatty", {"lines": 0, "hold": str(hold)})
    victim = submit(control_plane, "record", {"path": str(log)})
    cancelled = control_plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=victim.id))
    assert cancelled.state == S.CANCELLED
    after = submit(control_plane, "record", {"path": str(log)})
    hold.touch()
    wait_all_done(control_plane, [blocker.id, after.id])
    assert victim.id not in {j for j, _ in executions(log)}
    assert control_plane.get(victim.id).state == S.CANCELLED


@pytest.mark.serial  # times a bound in milliseconds: beside other tests it would time their load
def test_cancel_a_running_job_kills_its_process(control_plane: ControlProc, spawn_worker: Any, tmp_path: Path) -> None:
    spawn_worker(control_plane, threads=1)
    pid_file = tmp_path / "pid"
    job = submit(control_plane, "pid_sleep", {"pid_path": str(pid_file), "seconds": 30})
    pid = int(wait_until(lambda: pid_file.exists() and pid_file.read_text(), what="job to start"))
    t0 = time.monotonic()
    assert control_plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=job.id)).state == S.CANCELLED
    wait_until(lambda: not alive(pid), timeout=5, interval=0.002, what="the job's process to die")
    assert time.monotonic() - t0 <= 0.2 + 0.05  # the bound, plus the documented SIGTERM grace
    # and the slot is free again
    assert wait_done(control_plane, submit(control_plane, "noop").id).state == S.SUCCEEDED


@pytest.mark.serial  # times a bound in milliseconds: beside other tests it would time their load
@pytest.mark.parametrize("type_", ["pid_sleep", "pid_ignore_sigterm", "pid_native_block"])
def test_timeout_stops_the_job_and_frees_the_slot(
    control_plane: ControlProc, spawn_worker: Any, tmp_path: Path, type_: str
) -> None:
    # Given a job that would run for 30 s, with a 0.5 s timeout and max_attempts 1
    spawn_worker(control_plane, threads=1)
    pid_file = tmp_path / "pid"
    job = submit(control_plane, type_, {"pid_path": str(pid_file), "seconds": 30}, timeout_sec=0.5, max_attempts=1)
    pid = int(wait_until(lambda: pid_file.exists() and pid_file.read_text(), what="job to start"))
    # When its deadline passes
    wait_until(lambda: not alive(pid), timeout=5, interval=0.002, what="the job's process to die")
    died = time.time()
    done = wait_done(control_plane, job.id)
    # Then it is reported TIMEOUT, its process died within 200 ms (+ SIGTERM grace) of the deadline
    assert (done.state, done.error.code) == (S.FAILED, "TIMEOUT")
    deadline = done.started_at.ToNanoseconds() / 1e9 + 0.5
    assert died - deadline <= 0.2 + 0.05
    # and the worker's slot serves the next job
    assert wait_done(control_plane, submit(control_plane, "noop").id).state == S.SUCCEEDED


def test_a_job_goes_only_to_workers_that_run_its_type(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given two workers, only one of which (the one with a single thread) has the plug-in type `py_loop`
    plain = spawn_worker(control_plane, threads=4, slots=1, imports=())
    plugged = spawn_worker(control_plane, threads=1, imports=("tests.support.jobtypes",))
    # When jobs of that type (one wanting 4 threads) and built-in jobs are submitted together
    typed = submit_many(control_plane, [request("py_loop", {"n": 10}) for _ in range(7)])
    typed += submit_many(control_plane, [request("py_loop", {"n": 10}, thread_demand=4)])
    builtin = submit_many(control_plane, [request("sleep", {"seconds": 0.05}) for _ in range(8)])
    done = {job.id: job for job in wait_all_done(control_plane, [j.id for j in typed + builtin])}
    # Then every plug-in job ran on the worker that has it, first time (before: round-robin sent half
    # of them to the other worker, where they failed UNKNOWN_TYPE and spent their attempts)
    assert {(done[j.id].state, done[j.id].worker_id, done[j.id].attempts) for j in typed} == {
        (S.SUCCEEDED, plugged.worker_id, 1)
    }
    # the one wanting 4 threads with the most a worker that runs it has
    assert done[typed[-1].id].threads_granted == 1
    # and the built-in jobs used both workers
    assert {done[j.id].worker_id for j in builtin} == {plain.worker_id, plugged.worker_id}


def test_jobs_no_worker_runs_wait_without_holding_up_the_others(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given a plug-in type that a worker made known and then took away (it left)
    first = spawn_worker(control_plane, threads=1, imports=("tests.support.jobtypes",))
    first.signal(signal.SIGTERM)
    assert first.wait() == 0
    wait_until(lambda: first.worker_id not in {w.id for w in control_plane.workers()}, what="the worker to leave")
    spawn_worker(control_plane, threads=1, imports=())
    # When 200 jobs of that type are queued ahead of (higher priority than) built-in ones
    waiting = submit_many(control_plane, [request("py_loop", {"n": 10}, priority=100) for _ in range(200)])
    builtin = submit_many(control_plane, [request("noop") for _ in range(5)])
    # Then the built-in jobs run on the worker there is, while the others wait PENDING, not failed
    assert {j.state for j in wait_all_done(control_plane, [j.id for j in builtin])} == {S.SUCCEEDED}
    assert {control_plane.get(j.id).state for j in waiting[:10]} == {S.PENDING}
    # and once a worker that runs them comes, they all run there, each once
    back = spawn_worker(control_plane, threads=4, imports=("tests.support.jobtypes",))
    ran = wait_all_done(control_plane, [j.id for j in waiting])
    assert {(j.state, j.worker_id, j.attempts) for j in ran} == {(S.SUCCEEDED, back.worker_id, 1)}


@pytest.mark.parametrize("how", ["timeout", "cancel"])
def test_a_job_stopped_at_its_timeout_or_cancelled_leaves_no_child_process_behind(
    control_plane: ControlProc, spawn_worker: Any, tmp_path: Path, how: str
) -> None:
    # Given a job that runs a child process (a tool, a shell command) and waits for it
    spawn_worker(control_plane, threads=1)
    pid_file = tmp_path / "pid"
    limit = {"timeout_sec": 0.5} if how == "timeout" else {}
    job = submit(control_plane, "pid_spawn", {"pid_path": str(pid_file), "seconds": 60}, **limit)
    child = int(wait_until(lambda: pid_file.exists() and pid_file.read_text(), what="the child to start"))
    # When the job is stopped
    if how == "cancel":
        control_plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=job.id))
    done = wait_done(control_plane, job.id)
    assert done.state == (S.CANCELLED if how == "cancel" else S.FAILED)
    # Then the child goes with it (before: it ran on, orphaned, for its whole 60 s)
    wait_until(lambda: not alive(child), timeout=5, interval=0.01, what="the job's child process to die")


def test_a_process_a_job_left_running_ends_with_the_job(
    control_plane: ControlProc, spawn_worker: Any, tmp_path: Path
) -> None:
    # Given a job that starts a child process and returns without waiting for it
    spawn_worker(control_plane, threads=1)
    pid_file = tmp_path / "pid"
    job = submit(control_plane, "pid_spawn", {"pid_path": str(pid_file), "seconds": 60, "detach": True})
    done = wait_done(control_plane, job.id)
    child = int(pid_file.read_text())
    # Then the job succeeds, and its child does not run on under the jobs that follow
    assert done.state == S.SUCCEEDED and done.result["child"] == child
    wait_until(lambda: not alive(child), timeout=5, interval=0.01, what="the left child process to die")
    # and the worker's slot serves the next job
    assert wait_done(control_plane, submit(control_plane, "noop").id).state == S.SUCCEEDED


def test_a_helper_a_plugin_started_as_it_was_imported_is_not_taken_for_a_job_s(
    control_plane: ControlProc, spawn_worker: Any
) -> None:
    # Given a plug-in that starts a helper process at import, for all its jobs to share
    spawn_worker(control_plane, threads=1, imports=("tests.support.plugin_helper",))
    # When its jobs run one after another
    done = [wait_done(control_plane, submit(control_plane, "helper_pid").id) for _ in range(3)]
    # Then they all run in the same runner with the same helper: the runner is not replaced after each
    # job as if the job had left the helper behind
    assert {(j.state, j.result["runner"], j.result["helper"]) for j in done} == {
        (S.SUCCEEDED, done[0].result["runner"], done[0].result["helper"])
    }
    helper = done[0].result["helper"]
    assert isinstance(helper, float) and alive(int(helper))
