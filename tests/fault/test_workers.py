"""Worker faults: kill -9 mid-job, stale fencing tokens, SIGTERM drain."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from corral.v1 import admin_pb2, jobs_pb2, workers_pb2, workers_pb2_grpc
from tests.conftest import ControlProc, wait_until
from tests.support.calls import executions, submit, wait_done
from tests.support.partition import PartitionableRelay
from tests.support.processes import alive, children

S = jobs_pb2.Job


def _running_on(cp: ControlProc, job_id: str, workers: list[Any]) -> tuple[Any, Any]:
    """The worker ``job_id`` runs on, and the other one."""
    where = cp.get(job_id).worker_id
    (this,) = [w for w in workers if w.worker_id == where]
    (other,) = [w for w in workers if w is not this]
    return this, other


@pytest.mark.serial  # times the reaping bound to half a second: beside other tests it would time their load
def test_kill_9_of_a_worker_reruns_its_job_elsewhere(
    control_plane: ControlProc, spawn_worker: Any, tmp_path: Path
) -> None:
    # Given two workers and a job running on one of them (both started first: a worker started while
    # the job runs could take longer to come up than the job takes to end)
    log = tmp_path / "runs.log"
    workers = [spawn_worker(control_plane, threads=1) for _ in range(2)]
    job = submit(control_plane, "record", {"path": str(log), "seconds": 1.0})
    wait_until(lambda: executions(log), what="job to start")
    first, second = _running_on(control_plane, job.id, workers)
    runners = children(first.proc.pid)
    assert runners, "the worker should have pre-started runner processes"
    # When that worker is killed with SIGKILL
    first.kill()
    killed_at = time.monotonic()
    # Then it leaves the registry within the heartbeat timeout plus one interval
    wait_until(lambda: first.worker_id not in {w.id for w in control_plane.workers()}, timeout=10, what="reaping")
    assert time.monotonic() - killed_at <= 2.0 + 0.25 + 0.5  # timeout + interval + reaper tick
    # and the job re-runs on the other worker and succeeds with attempts = 2
    done = wait_done(control_plane, job.id)
    assert (done.state, done.attempts, done.worker_id) == (S.SUCCEEDED, 2, second.worker_id)
    assert executions(log) == [(job.id, 1), (job.id, 2)]
    # and no runner process of the killed worker is left behind
    wait_until(
        lambda: not any(alive(pid) for pid in runners), timeout=5, what="runner processes to die with their worker"
    )


def test_kill_9_of_a_gpu_worker_reruns_its_gpu_job_on_another_gpu_worker_and_frees_nothing_twice(
    control_plane: ControlProc, spawn_worker: Any, tmp_path: Path
) -> None:
    # Given two one-GPU workers, a GPU job running on one, and a second GPU job on the other's GPU
    log = tmp_path / "runs.log"
    gpu = {"CORRAL_WORKER_GPUS": "1"}
    workers = [spawn_worker(control_plane, threads=2, env=gpu) for _ in range(2)]
    job = submit(control_plane, "record", {"path": str(log), "seconds": 2.0}, gpu_count=1)  # still runs at the kill
    wait_until(lambda: executions(log), what="the GPU job to start")
    first, second = _running_on(control_plane, job.id, workers)
    other = submit(control_plane, "record", {"path": str(log), "seconds": 2.0}, gpu_count=1)
    wait_until(lambda: control_plane.get(other.id).worker_id == second.worker_id, what="the second GPU job to start")
    # When the first job's worker is killed with SIGKILL
    first.kill()
    # Then the first job re-runs on the second worker only once its GPU is free again, and both succeed
    done = [wait_done(control_plane, j.id, timeout=30) for j in (job, other)]
    assert [(d.state, d.worker_id) for d in done] == [(S.SUCCEEDED, second.worker_id)] * 2
    assert (done[0].attempts, done[1].attempts) == (2, 1)
    assert done[0].started_at.ToNanoseconds() >= done[1].finished_at.ToNanoseconds()
    assert executions(log).count((job.id, 2)) == 1
    # and the survivor's GPU is free again: none held for the dead worker's attempt
    wait_until(
        lambda: [(w.gpus, w.free_gpus) for w in control_plane.workers()] == [(1, 1)],
        timeout=10,
        what="the dead worker reaped and the GPU free",
    )


class FakeWorker:
    """Speaks the worker protocol directly, so a test can send what a real worker would not."""

    def __init__(self, cp: ControlProc, worker_id: str) -> None:
        self.worker_id = worker_id
        import queue

        self._q: queue.Queue[workers_pb2.WorkerMessage | None] = queue.Queue()
        self._q.put(workers_pb2.WorkerMessage(register=workers_pb2.Register(worker_id=worker_id, threads=1, slots=1)))
        self.stream = workers_pb2_grpc.WorkerServiceStub(cp.channel()).Connect(iter(self._q.get, None))

    def send(self, msg: workers_pb2.WorkerMessage) -> None:
        self._q.put(msg)

    def next(self, kind: str) -> workers_pb2.ControlMessage:
        for msg in self.stream:
            if msg.WhichOneof("msg") == kind or (kind in ("assign", "ack") and msg.HasField(kind)):
                found: workers_pb2.ControlMessage = msg
                return found
        raise AssertionError(f"stream ended before a {kind} message")

    def result(
        self,
        job_id: str,
        attempt: int,
        outcome: workers_pb2.JobResult.Outcome.ValueType = workers_pb2.JobResult.SUCCEEDED,
    ) -> None:
        r = workers_pb2.JobResult(
            attempt=workers_pb2.AttemptRef(job_id=job_id, attempt=attempt), outcome=outcome, result_json='{"x": 1}'
        )  # type: ignore[arg-type]
        self.send(workers_pb2.WorkerMessage(results=workers_pb2.Results(results=[r])))

    def close(self) -> None:
        self._q.put(None)
        self.stream.cancel()


def test_a_result_with_a_stale_fencing_token_changes_nothing(control_plane: ControlProc) -> None:
    # Given a job leased to a worker
    fake = FakeWorker(control_plane, "fake-1")
    try:
        fake.next("registered")
        job = submit(control_plane, "noop")
        assignment = fake.next("assign").assign.assignments[0]
        assert (assignment.job_id, assignment.attempt) == (job.id, 1)
        # When a result arrives for another attempt number
        fake.result(job.id, 7)
        ack = fake.next("ack")
        # Then it is acknowledged (so the worker forgets it) but not applied
        assert [(a.job_id, a.attempt) for a in ack.ack.attempts] == [(job.id, 7)]
        now = control_plane.get(job.id)
        assert (now.state, now.attempts, len(now.result.fields)) == (S.RUNNING, 1, 0)
        # and the genuine result still is
        fake.result(job.id, 1)
        done = wait_done(control_plane, job.id)
        assert (done.state, done.attempts) == (S.SUCCEEDED, 1)
        # and a late duplicate after completion changes nothing either
        fake.result(job.id, 1, workers_pb2.JobResult.FAILED)
        fake.next("ack")
        assert control_plane.get(job.id).state == S.SUCCEEDED
    finally:
        fake.close()


def test_a_reaped_worker_coming_back_cannot_apply_its_old_result(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given a job leased to a worker that then goes silent and is reaped
    fake = FakeWorker(control_plane, "fake-2")
    fake.next("registered")
    job = submit(control_plane, "noop", max_attempts=5)
    fake.next("assign")
    fake.close()
    wait_until(lambda: control_plane.get(job.id).state != S.RUNNING, timeout=10, what="lease to be given up")
    real = spawn_worker(control_plane, threads=1)
    done = wait_done(control_plane, job.id)
    assert (done.state, done.attempts, done.worker_id) == (S.SUCCEEDED, 2, real.worker_id)
    # When the old worker returns with its attempt-1 result
    back = FakeWorker(control_plane, "fake-2")
    try:
        back.next("registered")
        back.result(job.id, 1, workers_pb2.JobResult.FAILED)
        back.next("ack")
        # Then nothing changes
        after = control_plane.get(job.id)
        assert (after.state, after.attempts, after.worker_id) == (S.SUCCEEDED, 2, real.worker_id)
    finally:
        back.close()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_on_a_worker_finishes_its_job_takes_nothing_new_and_leaves(
    control_plane: ControlProc, spawn_worker: Any, tmp_path: Path, stop: signal.Signals
) -> None:
    log = tmp_path / "runs.log"
    w = spawn_worker(control_plane, threads=1)
    running = submit(control_plane, "record", {"path": str(log), "seconds": 1.0})
    wait_until(lambda: executions(log), what="job to start")
    # When the worker gets SIGTERM mid-job (or SIGHUP: the terminal it was started from closed)
    w.signal(stop)
    wait_until(
        lambda: (
            any(x.id == w.worker_id and x.state == admin_pb2.Worker.DRAINING for x in control_plane.workers())
            or w.proc.poll() is not None
        ),
        what="worker to drain",
    )
    queued = submit(control_plane, "record", {"path": str(log)})
    # Then the running job finishes on it, the worker exits 0 and leaves the registry
    done = wait_done(control_plane, running.id)
    assert (done.state, done.attempts, done.worker_id) == (S.SUCCEEDED, 1, w.worker_id)
    assert w.wait(30) == 0
    wait_until(lambda: w.worker_id not in {x.id for x in control_plane.workers()}, what="worker to leave")
    # and it took nothing new: the queued job waits for another worker
    assert control_plane.get(queued.id).state == S.PENDING
    other = spawn_worker(control_plane, threads=1)
    assert wait_done(control_plane, queued.id).worker_id == other.worker_id


def test_unregistered_stream_gets_invalid_argument(control_plane: ControlProc) -> None:
    stub = workers_pb2_grpc.WorkerServiceStub(control_plane.channel())
    stream = stub.Connect(iter([workers_pb2.WorkerMessage(heartbeat=workers_pb2.Heartbeat())]))
    try:
        list(stream)
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    else:
        raise AssertionError("expected INVALID_ARGUMENT")


@pytest.mark.parametrize(
    ("threads", "slots", "field"), [(0, 1, "threads"), (2**31 - 1, 1, "threads"), (4, 1025, "slots")]
)
def test_a_register_beyond_the_thread_limit_is_refused(
    control_plane: ControlProc, threads: int, slots: int, field: str
) -> None:
    # A worker claiming 2**31 threads would make every thread_demand fit it
    stub = workers_pb2_grpc.WorkerServiceStub(control_plane.channel())
    hello = workers_pb2.Register(worker_id="greedy", threads=threads, slots=slots)
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Connect(iter([workers_pb2.WorkerMessage(register=hello)]), timeout=10))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert f"register.{field}: must be between 1 and 1024" in (info.value.details() or "")  # type: ignore[attr-defined]
    assert not control_plane.admin.ListWorkers(admin_pb2.ListWorkersRequest(), timeout=10).workers


def test_a_register_with_labels_past_the_limits_is_refused(control_plane: ControlProc) -> None:
    # Worker labels show in ListWorkers, the CLI and the dashboards: a 100,000-character value was kept
    stub = workers_pb2_grpc.WorkerServiceStub(control_plane.channel())
    hello = workers_pb2.Register(worker_id="wordy", threads=1, slots=1, labels={"zone": "v" * 100_000})
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Connect(iter([workers_pb2.WorkerMessage(register=hello)]), timeout=10))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert "register.labels[zone]: must be at most 256 characters" in (info.value.details() or "")  # type: ignore[attr-defined]
    assert not control_plane.admin.ListWorkers(admin_pb2.ListWorkersRequest(), timeout=10).workers


@pytest.mark.parametrize(
    ("worker_id", "type_name", "expected"),
    [
        ("w\x00x", "noop", "register.worker_id: must not contain NUL characters"),
        ("w" * 129, "noop", "register.worker_id: must be at most 128 characters"),
        ("fine", "no\x00op", "register.job_types[0].name: must not contain NUL characters"),
    ],
)
def test_a_register_with_an_id_or_type_name_no_store_could_keep_is_refused(
    control_plane: ControlProc, worker_id: str, type_name: str, expected: str
) -> None:
    # Both are stored (with each job the worker runs, in the catalog): a NUL there failed a PostgreSQL
    # group commit, which stops the control plane, and again after each restart
    stub = workers_pb2_grpc.WorkerServiceStub(control_plane.channel())
    hello = workers_pb2.Register(worker_id=worker_id, threads=1, slots=1)
    hello.job_types.add(name=type_name, payload_schema_json="{}")
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Connect(iter([workers_pb2.WorkerMessage(register=hello)]), timeout=10))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert expected in (info.value.details() or "")  # type: ignore[attr-defined]
    assert not control_plane.admin.ListWorkers(admin_pb2.ListWorkersRequest(), timeout=10).workers


def test_a_hung_worker_loses_its_lease_at_deadline_plus_grace(control_plane: ControlProc, spawn_worker: Any) -> None:
    # Given a worker that takes a job with a 0.5 s timeout, keeps heartbeating, and never reports
    fake = FakeWorker(control_plane, "hung-1")
    try:
        fake.next("registered")
        job = submit(control_plane, "noop", timeout_sec=0.5, max_attempts=2)
        fake.next("assign")
        stop = threading.Event()

        def heartbeat() -> None:
            while not stop.wait(0.2):
                fake.send(workers_pb2.WorkerMessage(heartbeat=workers_pb2.Heartbeat()))

        beats = threading.Thread(target=heartbeat, daemon=True)
        beats.start()
        # When the deadline plus the lease grace passes
        cancel = fake.next("cancel")
        # Then the control plane takes the lease back, tells the worker to cancel, and retries elsewhere
        assert (cancel.cancel.attempt.job_id, cancel.cancel.attempt.attempt) == (job.id, 1)
        lost = control_plane.get(job.id)
        assert lost.error.code == "LEASE_EXPIRED"
        assert lost.state in (S.SCHEDULED, S.PENDING)
        real = spawn_worker(control_plane, threads=1)
        done = wait_done(control_plane, job.id)
        assert (done.state, done.attempts, done.worker_id) == (S.SUCCEEDED, 2, real.worker_id)
        # and the hung worker's late result for attempt 1 is not applied
        fake.result(job.id, 1, workers_pb2.JobResult.FAILED)
        fake.next("ack")
        assert control_plane.get(job.id).state == S.SUCCEEDED
        stop.set()
    finally:
        fake.close()


def test_drain_worker_finishes_its_job_and_the_worker_leaves(
    control_plane: ControlProc, spawn_worker: Any, tmp_path: Path
) -> None:
    log = tmp_path / "runs.log"
    w = spawn_worker(control_plane, threads=1)
    job = submit(control_plane, "record", {"path": str(log), "seconds": 0.5})
    wait_until(lambda: executions(log), what="job to start")
    drained = control_plane.admin.DrainWorker(admin_pb2.DrainWorkerRequest(id=w.worker_id))
    assert drained.state == admin_pb2.Worker.DRAINING
    assert wait_done(control_plane, job.id).state == S.SUCCEEDED
    assert w.wait(30) == 0
    wait_until(lambda: w.worker_id not in {x.id for x in control_plane.workers()}, what="worker to leave")


def test_a_second_worker_with_the_same_id_is_refused_and_the_first_keeps_its_jobs(
    control_plane: ControlProc, spawn_worker: Any, tmp_path: Path
) -> None:
    # Given a worker running a job
    log = tmp_path / "runs.log"
    first = spawn_worker(control_plane, threads=1, worker_id="gpu-1")
    job = submit(control_plane, "record", {"path": str(log), "seconds": 1.5})
    wait_until(lambda: executions(log), what="the job to start")
    # When another worker process is started with the same id (a copied CORRAL_WORKER_ID): before,
    # each registration replaced the other, ~20 times a second, killing the jobs of the one replaced
    second = spawn_worker(control_plane, threads=1, worker_id="gpu-1", wait=False)
    wait_until(lambda: "worker_refused" in first.log.read_text(), what="the second worker to be refused")
    # Then it is refused, naming the id and the setting, and the first keeps its job to the end, once
    assert "worker id 'gpu-1' is in use by a connected worker" in first.log.read_text()
    assert "CORRAL_WORKER_ID" in first.log.read_text()
    done = wait_done(control_plane, job.id)
    assert (done.state, done.attempts, done.worker_id) == (S.SUCCEEDED, 1, "gpu-1")
    assert executions(log) == [(job.id, 1)]
    (entry,) = [w for w in control_plane.workers() if w.id == "gpu-1"]
    assert entry.pid == first.proc.pid
    # and once the first has left, the second takes the id over
    first.signal(signal.SIGTERM)
    assert first.wait() == 0

    def second_registered() -> bool:
        return any(w.id == "gpu-1" and w.pid == second.proc.pid for w in control_plane.workers())

    wait_until(second_registered, timeout=15, what="the second worker to register")


@pytest.mark.slow
def test_a_worker_cut_off_by_a_silent_partition_reconnects_and_keeps_its_job(
    make_control_plane: Any, spawn_worker: Any, tmp_path: Path
) -> None:
    # Given a worker that reaches the control plane through a relay, running a 9 s job (heartbeat
    # timeout 10 s, the default)
    cp = make_control_plane(WORKER_HEARTBEAT_TIMEOUT_SEC=10)
    log = tmp_path / "runs.log"
    with PartitionableRelay(cp.port) as relay:
        worker = spawn_worker(cp, threads=1, address=relay.address)
        job = submit(cp, "record", {"path": str(log), "seconds": 9.0})
        wait_until(lambda: executions(log), what="the job to start")
        # When its connection goes silent both ways, with no FIN or RST (a partition, a peer host that
        # lost power): TCP alone would not tell the worker for many minutes, or ever while it only listens
        assert relay.cut() == 1
        cut_at = time.monotonic()
        # Then the worker notices within its keepalive bound and connects again
        wait_until(lambda: relay.connections >= 2, timeout=15, what="the worker to reconnect")
        assert time.monotonic() - cut_at <= 8.0  # keepalive 2 s + 3 s, a reconnect, scheduling slack
        # and, back before the heartbeat timeout, it keeps its job: one run, the first attempt (before:
        # it never noticed, the control plane reaped it, and its result went into the void)
        done = wait_done(cp, job.id, timeout=30)
        assert (done.state, done.attempts, done.worker_id) == (S.SUCCEEDED, 1, worker.worker_id)
        assert executions(log) == [(job.id, 1)]


@pytest.mark.slow
def test_an_assignment_lost_with_a_cut_connection_costs_its_job_no_attempt(
    make_control_plane: Any, spawn_worker: Any, tmp_path: Path
) -> None:
    # Given a worker that reaches the control plane through a relay, and a connection that goes silent
    # (heartbeat timeout 10 s, the default: the worker is back before it)
    cp = make_control_plane(WORKER_HEARTBEAT_TIMEOUT_SEC=10)
    log = tmp_path / "runs.log"
    with PartitionableRelay(cp.port) as relay:
        worker = spawn_worker(cp, threads=1, address=relay.address)
        assert relay.cut() == 1
        # When a job with one attempt is leased to it then: its assignment is lost with the connection
        job = submit(cp, "record", {"path": str(log)}, max_attempts=1)
        wait_until(lambda: cp.get(job.id).state == S.RUNNING, what="the job leased to the cut-off worker")
        assert relay.connections == 1
        # Then the worker, back on a new connection without it, is given it again, and it runs once:
        # before, the control plane counted it lost with the worker (WORKER_LOST) and, its one attempt
        # spent, the job ended FAILED without having run
        done = wait_done(cp, job.id, timeout=30)
        assert relay.connections >= 2
    assert (done.state, done.worker_id) == (S.SUCCEEDED, worker.worker_id), done.error
    assert executions(log) == [(job.id, done.attempts)]
    requeued = [e for e in cp.events("job_requeued") if e.get("job_id") == job.id]
    assert [e["reason"] for e in requeued] == ["NOT_RECEIVED"]
