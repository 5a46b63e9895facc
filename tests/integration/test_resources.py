"""GPUs and memory as capacities, through the real control plane and real workers: a job that asks
for them runs only where they are free, waits aside where no worker has them, and keeps holding them
across a restart of the control plane.

No GPU is needed: a worker hands out the device ids it is given (CORRAL_WORKER_GPUS), and these tests
check placement and accounting, not what a device computes.
"""

from __future__ import annotations

import signal
from typing import Any

import grpc
import pytest

from control.dispatch import MAX_SCAN
from corral.v1 import jobs_pb2
from tests.conftest import ControlProc, wait_until
from tests.integration.test_health_metrics import scrape
from tests.integration.test_rest import Rest, http_port
from tests.support.calls import request, submit, submit_many, wait_all_done, wait_done

S = jobs_pb2.Job


def gpu_worker(spawn_worker: Any, cp: ControlProc, gpus: str, threads: int = 4, memory_mb: int = 64_000) -> Any:
    return spawn_worker(
        cp, threads=threads, env={"CORRAL_WORKER_GPUS": gpus, "CORRAL_WORKER_MEMORY_MB": str(memory_mb)}
    )


def overlap(a: jobs_pb2.Job, b: jobs_pb2.Job) -> bool:
    """Whether the two ran at the same time, by the control plane's own clock (lease to result)."""
    return a.started_at.ToNanoseconds() < b.finished_at.ToNanoseconds() and (
        b.started_at.ToNanoseconds() < a.finished_at.ToNanoseconds()
    )


def test_gpu_jobs_run_only_on_a_worker_with_free_gpus(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given a worker without GPUs and one with two
    cpu = gpu_worker(spawn_worker, control_plane, "0")
    gpu = gpu_worker(spawn_worker, control_plane, "2")
    # When three one-GPU jobs and four plain jobs are submitted
    gpu_ids = [submit(control_plane, "sleep", {"seconds": 0.6}, gpu_count=1).id for _ in range(3)]
    plain_ids = [submit(control_plane, "sleep", {"seconds": 0.2}).id for _ in range(4)]
    done = wait_all_done(control_plane, gpu_ids + plain_ids, timeout=60)
    assert {j.state for j in done} == {S.SUCCEEDED}, [j.error for j in done]
    g = done[:3]
    # Then every GPU job ran on the GPU worker, on its first attempt, and says what it held
    assert {j.worker_id for j in g} == {gpu.worker_id}
    assert [j.attempts for j in g] == [1, 1, 1]
    assert [j.gpu_count for j in g] == [1, 1, 1]
    # and never more than two at once: the third started after one of the first two finished
    pairs = [(a, b) for i, a in enumerate(g) for b in g[i + 1 :]]
    assert sum(overlap(a, b) for a, b in pairs) <= 2, "three one-GPU jobs ran at once on two GPUs"
    # while the plain jobs went to both workers
    assert {j.worker_id for j in done[3:]} == {cpu.worker_id, gpu.worker_id}


def test_a_job_waiting_for_a_gpu_leaves_the_workers_threads_to_other_jobs(
    control_plane: ControlProc, spawn_worker: Any
) -> None:
    # Given one 4-thread worker with one GPU, busy with a long GPU job, and more GPU jobs waiting than a
    # dispatch pass looks past (MAX_SCAN)
    gpu_worker(spawn_worker, control_plane, "1")
    first = submit(control_plane, "sleep", {"seconds": 3.0}, gpu_count=1)
    wait_until(lambda: control_plane.get(first.id).state == S.RUNNING, 10, what="the first GPU job to start")
    waiting = submit_many(control_plane, [request("noop", {}, gpu_count=1, priority=50) for _ in range(MAX_SCAN + 6)])
    second = waiting[0]
    # When plain jobs come after it
    plain = [submit(control_plane, "sleep", {"seconds": 0.1}).id for _ in range(3)]
    # Then they run on the worker's free threads while the GPU is busy, not after it
    done = wait_all_done(control_plane, plain, timeout=30)
    assert {j.state for j in done} == {S.SUCCEEDED}
    first_now = control_plane.get(first.id)
    assert first_now.state == S.RUNNING, "the plain jobs waited for the GPU job to end"
    # and the waiting GPU job starts once the GPU is free, on its first attempt
    ended = wait_done(control_plane, second.id, timeout=30)
    first_done = control_plane.get(first.id)
    assert ended.state == S.SUCCEEDED and ended.attempts == 1
    assert ended.started_at.ToNanoseconds() >= first_done.finished_at.ToNanoseconds()


def test_a_job_asking_for_more_gpus_than_any_worker_has_waits_aside_until_one_connects(
    control_plane: ControlProc, spawn_worker: Any
) -> None:
    # Given a worker with one GPU
    gpu_worker(spawn_worker, control_plane, "1")
    # When a job asks for two, and a plain job comes after it
    big = submit(control_plane, "noop", {}, gpu_count=2, priority=100)
    small = submit(control_plane, "noop", {})
    # Then the plain job runs, the big one waits PENDING, and the control plane says why
    assert wait_done(control_plane, small.id).state == S.SUCCEEDED
    assert control_plane.get(big.id).state == S.PENDING
    unserved = wait_until(lambda: control_plane.events("job_type_unserved"), 10, what="job_type_unserved")
    assert unserved[-1].get("gpu_count") == 2
    # When a worker with two GPUs connects, the big job runs there
    two = gpu_worker(spawn_worker, control_plane, "0,1")
    done = wait_done(control_plane, big.id)
    assert (done.state, done.worker_id, done.attempts) == (S.SUCCEEDED, two.worker_id, 1)


def test_memory_is_held_while_a_job_runs(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given a worker that gives jobs 1000 MiB
    worker = gpu_worker(spawn_worker, control_plane, "0", memory_mb=1000)
    # When two jobs of 600 MiB each and one of 400 MiB are submitted
    a = submit(control_plane, "sleep", {"seconds": 0.5}, memory_mb=600)
    b = submit(control_plane, "sleep", {"seconds": 0.5}, memory_mb=600)
    c = submit(control_plane, "sleep", {"seconds": 0.3}, memory_mb=400)
    too_big = submit(control_plane, "noop", {}, memory_mb=1001)
    done = wait_all_done(control_plane, [a.id, b.id, c.id], timeout=30)
    assert {j.state for j in done} == {S.SUCCEEDED}
    ja, jb, jc = done
    # Then the two 600 MiB jobs never ran at once, and the 400 MiB one ran beside one of them
    assert not overlap(ja, jb)
    assert overlap(ja, jc) or overlap(jb, jc)
    assert ja.memory_mb == 600
    # and a job asking for more than the worker has waits
    assert control_plane.get(too_big.id).state == S.PENDING
    listed = {w.id: w for w in control_plane.workers()}[worker.worker_id]
    assert (listed.memory_mb, listed.free_memory_mb, listed.gpus, listed.free_gpus) == (1000, 1000, 0, 0)


def test_list_workers_and_metrics_show_the_gpus_and_memory_a_running_job_holds(
    control_plane: ControlProc, spawn_worker: Any
) -> None:
    worker = gpu_worker(spawn_worker, control_plane, "0,1", memory_mb=2000)
    job = submit(control_plane, "sleep", {"seconds": 2.0}, gpu_count=1, memory_mb=300)
    wait_until(lambda: control_plane.get(job.id).state == S.RUNNING, 10, what="the job to start")

    def mine() -> Any:
        return {w.id: w for w in control_plane.workers()}[worker.worker_id]

    rest = Rest(http_port(control_plane))
    held = mine()
    assert (held.gpus, held.free_gpus, held.memory_mb, held.free_memory_mb) == (2, 1, 2000, 1700)
    metrics = scrape(rest)
    assert (metrics['corral_gpus{state="held"}'], metrics['corral_gpus{state="free"}']) == (1, 1)
    assert (metrics['corral_memory_mb{state="held"}'], metrics['corral_memory_mb{state="free"}']) == (300, 1700)
    assert wait_done(control_plane, job.id).state == S.SUCCEEDED
    freed = wait_until(lambda: (w := mine()).free_gpus == 2 and w, 10, what="the GPU to come back")
    assert freed.free_memory_mb == 2000
    after = scrape(rest)
    assert after['corral_gpus{state="free"}'] == 2
    assert after['corral_owner_gpu_seconds_total{group="",owner=""}'] >= 2.0  # one GPU for the 2 s sleep


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_a_running_job_keeps_its_gpu_across_a_control_plane_restart(
    control_plane: ControlProc, spawn_worker: Any, how: signal.Signals
) -> None:
    # Given a one-GPU worker running a GPU job
    worker = gpu_worker(spawn_worker, control_plane, "1")
    first = submit(control_plane, "sleep", {"seconds": 4.0}, gpu_count=1)
    wait_until(lambda: control_plane.get(first.id).state == S.RUNNING, 10, what="the GPU job to start")
    # When the control plane restarts (the worker stays up and reconnects)
    if how == signal.SIGKILL:
        control_plane.kill()
    else:
        assert control_plane.stop() == 0
    control_plane.start()
    wait_until(
        lambda: any(w.id == worker.worker_id and w.state == w.AVAILABLE for w in control_plane.workers()),
        20,
        what="the worker to reconnect",
    )
    # Then the re-adopted job still holds the GPU: a second GPU job waits for it
    second = submit(control_plane, "sleep", {"seconds": 0.1}, gpu_count=1)
    done = [wait_done(control_plane, j.id, timeout=30) for j in (first, second)]
    assert [j.state for j in done] == [S.SUCCEEDED, S.SUCCEEDED]
    assert [j.attempts for j in done] == [1, 1], "a GPU job was handed back or re-run"
    assert done[1].started_at.ToNanoseconds() >= done[0].finished_at.ToNanoseconds()


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("gpu_count", -1, "must be between 0 and 64, got -1"),
        ("gpu_count", 65, "must be between 0 and 64, got 65"),
        ("memory_mb", -5, "must be between 0 and 1073741824, got -5"),
    ],
)
def test_bad_gpu_or_memory_requests_are_refused_and_store_nothing(
    control_plane: ControlProc, field: str, value: int, rule: str
) -> None:
    before = control_plane.jobs.GetStats(jobs_pb2.GetStatsRequest(), timeout=10).jobs_by_status
    with pytest.raises(grpc.RpcError) as err:
        submit(control_plane, "noop", {}, **{field: value})
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == f"{field}: {rule}"
    batch = jobs_pb2.SubmitJobsRequest(jobs=[request("noop", {}), request("noop", {}, **{field: value})])
    with pytest.raises(grpc.RpcError) as err:
        control_plane.jobs.SubmitJobs(batch, timeout=10)
    assert err.value.details() == f"jobs[1].{field}: {rule}"
    after = control_plane.jobs.GetStats(jobs_pb2.GetStatsRequest(), timeout=10).jobs_by_status
    assert dict(after) == dict(before)
