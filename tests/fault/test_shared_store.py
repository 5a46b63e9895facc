"""Control planes on one PostgreSQL database: one leads, the others stand by, and a takeover loses
nothing and runs nothing twice that had not started. Real control planes, workers and PostgreSQL (the
session's throw-away cluster, ``tests/support/postgres.py``)."""

from __future__ import annotations

import secrets
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import timestamp_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

import corral
from control.store.postgres import LOCK_KEY
from corral.v1 import jobs_pb2, jobs_pb2_grpc
from tests.conftest import ControlProc, registered_on, wait_until
from tests.integration.test_health_metrics import scrape
from tests.integration.test_rest import Rest
from tests.support.calls import executions, request, submit_many, wait_all_done
from tests.support.postgres import Cluster

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

S = jobs_pb2.Job


def test_a_control_plane_on_postgres_runs_jobs_and_keeps_them_across_a_restart(
    shared_pair: tuple[ControlProc, ControlProc, str], spawn_worker: Any, tmp_path: Path
) -> None:
    first, _, _ = shared_pair
    log = tmp_path / "runs.log"
    spawn_worker(first, threads=2)
    jobs = submit_many(first, [request("record", {"path": str(log), "seconds": 0}) for _ in range(50)])
    done = wait_all_done(first, [j.id for j in jobs], timeout=60)
    assert Counter(j.state for j in done) == {S.SUCCEEDED: 50}
    assert first.stop(signal.SIGTERM) == 0
    first.start()
    kept = wait_all_done(first, [j.id for j in jobs], timeout=30)
    assert [(j.id, j.state, j.attempts) for j in kept] == [(j.id, S.SUCCEEDED, 1) for j in done]
    stats = first.jobs.GetStats(jobs_pb2.GetStatsRequest(), timeout=10)
    assert dict(stats.jobs_by_status)["SUCCEEDED"] == 50


def test_a_standby_answers_health_checks_only_and_stops_cleanly_on_sigterm(
    shared_pair: tuple[ControlProc, ControlProc, str],
) -> None:
    first, second, _ = shared_pair
    second.start_standby()
    assert first.proc is not None
    leader = f"pid {first.proc.pid}"
    (event,) = second.events("store_standby")
    assert leader in event["active"]  # it names the one that leads
    # Alive and not ready, on gRPC and HTTP, so that an orchestrator keeps it and routes nothing to it
    channel = grpc.insecure_channel(second.address)
    health = health_pb2_grpc.HealthStub(channel)
    wait_until(lambda: _answers(health), 10, what="the standby's health service")
    assert health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status == SERVING
    assert health.Check(health_pb2.HealthCheckRequest(service="corral.v1.JobService"), timeout=5).status == NOT_SERVING
    rest = Rest(second.http_port)
    assert rest.get("/healthz").status == 200
    ready = rest.get("/readyz")
    assert ready.status == 503 and leader in ready.json()["reason"] and "standby" in ready.json()["reason"]
    # and says which it is on /metrics, for an alert on "no control plane leads"
    assert scrape(rest)["corral_control_plane_active"] == 0
    assert scrape(Rest(first.http_port))["corral_control_plane_active"] == 1
    # and every call is UNAVAILABLE naming the leader, over gRPC and REST, with nothing done
    with pytest.raises(grpc.RpcError) as err:
        jobs_pb2_grpc.JobServiceStub(channel).SubmitJob(jobs_pb2.SubmitJobRequest(type="noop"), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and leader in (err.value.details() or "")
    rejected = rest.post("/v1/jobs", {"type": "noop"})
    assert rejected.status == 503 and leader in rejected.json()["message"]
    channel.close()
    assert first.jobs.GetStats(jobs_pb2.GetStatsRequest(), timeout=10).jobs_by_status["PENDING"] == 0
    # When it is stopped it exits 0, and the leader is untouched
    assert second.stop(signal.SIGTERM, timeout=10) == 0
    assert first.workers() == []


def _answers(health: health_pb2_grpc.HealthStub) -> bool:
    try:
        health.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
    except grpc.RpcError:
        return False
    return True


@pytest.mark.slow
def test_kill_9_of_the_active_control_plane_hands_over_to_the_standby_losing_nothing(
    shared_pair: tuple[ControlProc, ControlProc, str], spawn_worker: Any, tmp_path: Path
) -> None:
    # Given an active control plane, a standby, and workers that know both addresses
    first, second, _ = shared_pair
    second.start_standby()
    both = f"{first.address},{second.address}"
    for _ in range(2):
        spawn_worker(first, threads=4, address=both)
    # and 600 accepted jobs: some running, most queued, some scheduled for later
    log = tmp_path / "runs.log"
    later = timestamp_pb2.Timestamp()
    later.FromNanoseconds(int((time.time() + 2) * 1e9))
    reqs = [request("record", {"path": str(log), "seconds": 0.02}) for _ in range(500)]
    reqs += [request("record", {"path": str(log), "seconds": 0.02}, scheduled_at=later) for _ in range(99)]
    keyed = request("record", {"path": str(log), "seconds": 0.02}, idempotency_key="order-17")
    jobs = submit_many(first, [*reqs, keyed])
    wait_until(lambda: len(executions(log)) >= 50, what="some jobs to run")
    # When the active one is killed with SIGKILL
    first.kill()
    killed_at = time.monotonic()
    started_before = Counter(job_id for job_id, _ in executions(log))
    # Then the standby takes over, the workers find it, and every job succeeds: none lost
    second.wait_serving(30)
    serving_after = time.monotonic() - killed_at
    (leading,) = second.events("store_leading")
    assert leading["waited"] is True
    done = wait_all_done(second, [j.id for j in jobs], timeout=180)
    assert Counter(j.state for j in done) == {S.SUCCEEDED: 600}
    # A client that retries its keyed submission on the new one gets the same job, not a second
    (again,) = submit_many(second, [keyed])
    assert again.id == jobs[-1].id
    runs = Counter(job_id for job_id, _ in executions(log))
    assert set(runs) == {j.id for j in jobs}
    # and a job ran twice only if it had started before the kill
    reruns = {job_id for job_id, n in runs.items() if n > 1}
    assert reruns <= set(started_before), f"re-ran jobs that had not started: {reruns - set(started_before)}"
    assert {w.id for w in second.workers()} == {w.id for w in second.workers() if w.state != w.UNAVAILABLE}
    print(
        f"\ntakeover with 600 jobs: the standby served {serving_after:.2f} s after the kill; "
        f"{len(started_before)} jobs had started, {len(reruns)} re-ran"
    )


def test_an_active_control_plane_that_loses_its_database_session_stops_and_the_standby_takes_over(
    shared_pair: tuple[ControlProc, ControlProc, str], postgres: Cluster, spawn_worker: Any, tmp_path: Path
) -> None:
    # Given an active control plane with a worker, and a standby
    first, second, url = shared_pair
    second.start_standby()
    worker = spawn_worker(first, threads=2, address=f"{first.address},{second.address}")
    # When the active one's database session is ended (its lock goes with it) while it is idle
    postgres.sql(
        url, f"SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND objid = {LOCK_KEY}"
    )
    # Then it stops on its own with the store's exit status, and the standby leads and runs new jobs
    assert first.proc is not None
    assert first.proc.wait(20) == 3
    second.wait_serving(30)
    wait_until(lambda: registered_on(second, worker), 20, what="the worker on the standby")
    log = tmp_path / "runs.log"
    jobs = submit_many(second, [request("record", {"path": str(log), "seconds": 0}) for _ in range(10)])
    done = wait_all_done(second, [j.id for j in jobs], timeout=60)
    assert Counter(j.state for j in done) == {S.SUCCEEDED: 10}


def test_a_standby_whose_database_sessions_were_ended_reconnects_and_still_takes_over(
    shared_pair: tuple[ControlProc, ControlProc, str], postgres: Cluster, spawn_worker: Any, tmp_path: Path
) -> None:
    # Given a standby whose every session to the database is ended (a server restart, a proxy that
    # dropped idle connections), while it waits
    first, second, url = shared_pair
    second.start_standby()
    assert second.proc is not None
    ended = postgres.sql(
        url,
        f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE '% pid {second.proc.pid}'",
    )
    assert len(ended) == 3  # its writer (the one that tries the lock), its reader and its key lookups
    # Then it says so and goes on standing by, not serving
    wait_until(lambda: second.events("store_unreachable"), 10, what="the standby to notice")
    assert not second.serving()
    # and when the active one is killed, it takes over with fresh sessions and runs jobs
    worker = spawn_worker(first, threads=2, address=f"{first.address},{second.address}")
    first.kill()
    second.wait_serving(30)
    # (the job type is a plug-in's: known once the worker has registered there, as after any restart)
    wait_until(lambda: registered_on(second, worker), 20, what="the worker on the standby")
    log = tmp_path / "runs.log"
    jobs = submit_many(second, [request("record", {"path": str(log), "seconds": 0}) for _ in range(10)])
    done = wait_all_done(second, [j.id for j in jobs], timeout=60)
    assert Counter(j.state for j in done) == {S.SUCCEEDED: 10}
    assert [j.id for j in second.jobs.ListJobs(jobs_pb2.ListJobsRequest(limit=5), timeout=10).jobs]


@pytest.mark.slow
def test_a_sigterm_of_the_active_control_plane_hands_over_with_nothing_run_twice(
    shared_pair: tuple[ControlProc, ControlProc, str], spawn_worker: Any, tmp_path: Path
) -> None:
    # Given long jobs running on workers that know both control planes, and a standby
    first, second, _ = shared_pair
    second.start_standby()
    log = tmp_path / "runs.log"
    for _ in range(2):
        spawn_worker(first, threads=10, address=f"{first.address},{second.address}")
    jobs = submit_many(first, [request("record", {"path": str(log), "seconds": 1.0}) for _ in range(60)])
    wait_until(lambda: len(executions(log)) >= 20, what="20 jobs to be running")
    # When the active one is stopped (a rolling update)
    assert first.stop(signal.SIGTERM) == 0
    # Then the standby leads, re-adopts the running jobs, and every job ran once, on its first attempt
    second.wait_serving(30)
    done = wait_all_done(second, [j.id for j in jobs], timeout=120)
    assert {(j.state, j.attempts) for j in done} == {(S.SUCCEEDED, 1)}
    runs = Counter(job_id for job_id, _ in executions(log))
    assert len(runs) == 60 and set(runs.values()) == {1}


def test_accounts_and_their_logins_pass_to_the_standby_that_takes_over(
    shared_pair: tuple[ControlProc, ControlProc, str], spawn_worker: Any
) -> None:
    # Given two control planes with accounts on one database (the first restarted with them on)
    first, second, _ = shared_pair
    worker_token = secrets.token_urlsafe(24)
    accounts = {"CORRAL_ACCOUNTS": "open", "CORRAL_WORKER_TOKEN": worker_token, "CORRAL_PASSWORD_ROUNDS": "10"}
    assert first.stop(signal.SIGTERM) == 0
    first.env.update(accounts)
    first.start()
    second.env.update(accounts)
    second.start_standby()
    # and a person who registered and logged in on the first (whose login the harness uses too)
    with corral.Client(first.address) as anonymous:
        anonymous.register("alice", "correct horse")
        login = anonymous.login("alice", "correct horse")
    first.token = second.token = login.token
    spawn_worker(
        first, threads=1, address=f"{first.address},{second.address}", env={"CORRAL_WORKER_TOKEN": worker_token}
    )
    # When the first is killed and the standby takes over
    first.kill()
    second.wait_serving(30)
    # Then the login made on the first works on the second (one key, kept in the store), and so does the password
    with corral.Client(second.address, token=login.token) as alice:
        assert alice.whoami().name == "alice"
        assert alice.wait(alice.submit("noop").id, timeout=60).owner == "alice"
    with corral.Client(second.address) as anonymous:
        anonymous.login("alice", "correct horse")
