"""AUTOSCALE_MODE=recommend on a real control plane with real workers: every decision shows in GET
/v1/autoscaler, in /metrics and in the log, sized to the backlog, and nothing is started or stopped."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import corral
from corral.v1 import admin_pb2, jobs_pb2
from tests.conftest import ControlProc, wait_until
from tests.integration.test_health_metrics import scrape
from tests.integration.test_rest import Rest
from tests.support.calls import request, submit_many

T = TypeVar("T")

RECOMMEND = {
    "AUTOSCALE_MODE": "recommend",
    "AUTOSCALE_INTERVAL": "0.2",
    "QUEUE_THRESHOLD_HIGH": "2",
    "QUEUE_THRESHOLD_LOW": "1",
    "MIN_WORKERS": "1",
    "MAX_WORKERS": "5",
    "SCALE_DOWN_STABLE_SEC": "0.6",
    "CORRAL_SCALE_COOLDOWN_SEC": "0.5",
    "CORRAL_WORKER_THREADS": "2",
}


def status(rest: Rest) -> dict[str, Any]:
    reply = rest.get("/v1/autoscaler")
    assert reply.status == 200, reply.body
    body: dict[str, Any] = reply.json()
    return body


def until(fn: Callable[[], T | None], timeout: float = 10.0, interval: float = 0.05, what: str = "") -> T:
    """``wait_until`` for predicates that return the thing waited for, or None."""
    value = wait_until(fn, timeout, interval, what)
    assert value is not None
    return value


def status_when(rest: Rest, field: str, value: Any = None) -> Callable[[], dict[str, Any] | None]:
    """A predicate: GET /v1/autoscaler once ``field`` is set (to ``value`` when given)."""

    def check() -> dict[str, Any] | None:
        s = status(rest)
        return s if (s.get(field) if value is None else s.get(field) == value) else None

    return check


def test_recommend_mode_reports_decisions_and_changes_nothing(make_control_plane: Any, spawn_worker: Any) -> None:
    cp: ControlProc = make_control_plane(**RECOMMEND)
    rest = Rest(cp.http_port)

    # Given no worker at all: it recommends one (MIN_WORKERS 1)
    st = until(status_when(rest, "lastAction"), what="a first recommendation")
    assert st["mode"] == "recommend" and st["minWorkers"] == 1 and st["maxWorkers"] == 5
    assert (st["lastAction"], st["lastActionStep"], st["lastActionReason"]) == ("up", 1, "below_min")
    assert st.get("currentWorkers", 0) == 0 and st.get("lastError", "") == ""

    # When one worker of 1 thread gets 7 slow jobs: 6 wait, asking 6 threads; with 2-thread workers
    # the backlog needs 3 more
    worker = spawn_worker(cp, threads=1)
    jobs = submit_many(cp, [request("sleep", {"seconds": 30}) for _ in range(7)])

    st = until(status_when(rest, "lastActionReason", "backlog"), what="a backlog recommendation")
    assert (st["lastAction"], st["lastActionStep"]) == ("up", 3)
    assert st["currentWorkers"] == 1 and st["desiredWorkers"] == 4
    assert st["readyJobs"] == 6 and st["readyThreads"] == 6 and st.get("freeThreads", 0) == 0
    assert st["lastDecision"].startswith("up +3 (backlog: 6 ready jobs asking 6 threads")
    metrics = scrape(rest)
    assert metrics['corral_autoscaler_decisions_total{action="up",reason="backlog"}'] >= 1
    assert metrics['corral_autoscaler_workers{state="desired"}'] in (1.0, 4.0)  # none decisions follow
    recommendations = cp.events("scale_recommendation")
    assert any(r["reason"] == "backlog" and r["step"] == 3 and r["desired"] == 4 for r in recommendations)
    # ... and nothing was started: still the one worker
    assert [w.id for w in cp.workers()] == [worker.worker_id]

    # When the backlog goes and a second, idle worker joins: after the stable period it recommends one fewer
    for job in jobs:
        cp.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=job.id), timeout=10)
    spawn_worker(cp, threads=2)

    st = until(status_when(rest, "lastActionReason", "idle"), what="a scale-down recommendation")
    assert (st["lastAction"], st["lastActionStep"]) == ("down", 1)
    assert st["scaleDowns"] >= 1 and st["scaleUps"] >= 2
    assert scrape(rest)['corral_autoscaler_decisions_total{action="down",reason="idle"}'] >= 1
    assert len(cp.workers()) == 2
    assert all(w.state != admin_pb2.Worker.DRAINING for w in cp.workers())

    # The Python client shows the same state
    with corral.Client(cp.address) as client:
        status = client.autoscaler()
    assert (status.mode, status.last_action, status.last_action_step) == ("recommend", "down", 1)
    assert status.scale_downs >= 1 and status.last_action_at is not None
    assert status.to_dict()["last_action_at"] is not None


def test_autoscaler_is_off_by_default(control_plane: ControlProc, spawn_worker: Any) -> None:
    spawn_worker(control_plane)
    st = control_plane.admin.GetAutoscaler(admin_pb2.GetAutoscalerRequest(), timeout=10)
    assert (st.mode, st.current_workers, st.desired_workers, st.last_decision) == ("off", 1, 1, "")
    assert "corral_autoscaler_decisions_total" not in "".join(scrape(Rest(control_plane.http_port)))


def test_jobs_that_ask_for_gpus_are_not_backlog_for_workers_without_them(
    make_control_plane: Any, spawn_worker: Any
) -> None:
    cp: ControlProc = make_control_plane(**RECOMMEND)
    rest = Rest(cp.http_port)
    # Given a busy one-thread worker, and four jobs waiting for GPUs that no worker, started or not, has
    spawn_worker(cp, threads=1)
    busy = submit_many(cp, [request("sleep", {"seconds": 30})])
    gpu_jobs = [request("sleep", {"seconds": 1}) for _ in range(4)]
    for gpu_job in gpu_jobs:
        gpu_job.gpu_count = 1
    submit_many(cp, gpu_jobs)
    # When three plain jobs queue behind the busy one
    submit_many(cp, [request("sleep", {"seconds": 30}) for _ in range(3)])

    # Then the backlog is those three: starting workers for the GPU jobs would not run them. (The first
    # recommendation, made before the worker registered, is "below_min"; a cooldown follows it.)
    def backlog_of_three() -> dict[str, Any] | None:
        st = status(rest)
        return st if st.get("readyThreads") == 3 and st.get("lastActionReason") == "backlog" else None

    st = until(backlog_of_three, what="a backlog recommendation for the plain jobs")
    assert st["readyJobs"] == 3
    assert (st["lastAction"], st["lastActionStep"]) == ("up", 2)
    for running in busy:
        cp.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=running.id))


def test_jobs_whose_worker_selector_no_new_container_matches_are_not_backlog(
    make_control_plane: Any, spawn_worker: Any
) -> None:
    cp: ControlProc = make_control_plane(**RECOMMEND)
    rest = Rest(cp.http_port)
    # Given a busy one-thread worker labelled pool=special, and four jobs that only it may run: a worker
    # the autoscaler starts is labelled container=<its id> and autoscale_group=<group> only, so more
    # of them would never run those jobs (and, counted as backlog, they would keep the fleet at MAX)
    spawn_worker(cp, threads=1, env={"CORRAL_WORKER_LABELS": "pool=special"})
    busy = submit_many(cp, [request("sleep", {"seconds": 30})])
    wait_until(lambda: cp.get(busy[0].id).state == jobs_pb2.Job.RUNNING, what="the busy job to run")
    submit_many(cp, [request("sleep", {"seconds": 1}, worker_selector={"pool": "special"}) for _ in range(4)])
    # When three plain jobs, and one that asks for the autoscaler's own group, queue behind the busy one
    plain = [request("sleep", {"seconds": 30}) for _ in range(3)]
    plain.append(request("sleep", {"seconds": 30}, worker_selector={"autoscale_group": "corral"}))
    submit_many(cp, plain)

    # Then the backlog is those four, which a new container would run: 4 threads, 2 more workers
    def backlog_of_four() -> dict[str, Any] | None:
        st = status(rest)
        return st if st.get("readyThreads") == 4 and st.get("lastActionReason") == "backlog" else None

    st = until(backlog_of_four, what="a backlog recommendation for the jobs a container could run")
    assert st["readyJobs"] == 4
    assert (st["lastAction"], st["lastActionStep"]) == ("up", 2)
    for running in busy:
        cp.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=running.id))
