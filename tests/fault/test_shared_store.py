"""Control planes on one PostgreSQL database: one leads, the others stand by, and a takeover loses
nothing and runs nothing twice that had not started. Real control planes, workers and PostgreSQL (the
session's throw-away cluster, ``tests/support/postgres.py``)."""

from __future__ import annotations

import signal
import socket
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import timestamp_pb2

from control.store.postgres import LOCK_KEY
from corral.v1 import jobs_pb2
from tests.conftest import FAST_ENV, ControlProc, wait_until
from tests.support.calls import executions, request, submit_many, wait_all_done
from tests.support.postgres import Cluster

S = jobs_pb2.Job


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def pair(postgres: Cluster, tmp_path: Path) -> Iterator[tuple[ControlProc, ControlProc, str]]:
    """Two control planes on one new database, each with a fixed gRPC port (so that workers can list
    both before the second serves): the first started and leading, the second not started yet."""
    url = postgres.new_database()
    made = []
    for name in ("a", "b"):
        workdir = tmp_path / f"control-{name}"
        workdir.mkdir()
        made.append(ControlProc(workdir, dict(FAST_ENV), port=_free_port(), db_url=url))
    first, second = made
    first.start()
    try:
        yield first, second, url
    finally:
        for cp in made:
            cp.close()


def _standing_by(cp: ControlProc) -> bool:
    return bool(cp.events("store_standby")) and not cp.serving()


def test_a_control_plane_on_postgres_runs_jobs_and_keeps_them_across_a_restart(
    pair: tuple[ControlProc, ControlProc, str], spawn_worker: Any, tmp_path: Path
) -> None:
    first, _, _ = pair
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


def test_a_standby_serves_nothing_and_stops_cleanly_on_sigterm(pair: tuple[ControlProc, ControlProc, str]) -> None:
    first, second, _ = pair
    second.start(wait=False)
    wait_until(lambda: _standing_by(second), 20, what="the second control plane to stand by")
    (event,) = second.events("store_standby")
    assert f"pid {first.proc.pid if first.proc else 0}" in event["active"]  # it names the one that leads
    with pytest.raises(OSError):  # its port is not even open
        socket.create_connection(("127.0.0.1", second.port), timeout=2).close()
    assert second.stop(signal.SIGTERM, timeout=10) == 0
    assert first.workers() == []  # the first is untouched


@pytest.mark.slow
def test_kill_9_of_the_active_control_plane_hands_over_to_the_standby_losing_nothing(
    pair: tuple[ControlProc, ControlProc, str], spawn_worker: Any, tmp_path: Path
) -> None:
    # Given an active control plane, a standby, and workers that know both addresses
    first, second, _ = pair
    second.start(wait=False)
    wait_until(lambda: _standing_by(second), 20, what="the second control plane to stand by")
    both = f"{first.address},{second.address}"
    for _ in range(2):
        spawn_worker(first, threads=4, address=both)
    # and 600 accepted jobs: some running, most queued, some scheduled for later
    log = tmp_path / "runs.log"
    later = timestamp_pb2.Timestamp()
    later.FromNanoseconds(int((time.time() + 2) * 1e9))
    reqs = [request("record", {"path": str(log), "seconds": 0.02}) for _ in range(500)]
    reqs += [request("record", {"path": str(log), "seconds": 0.02}, scheduled_at=later) for _ in range(100)]
    jobs = submit_many(first, reqs)
    wait_until(lambda: len(executions(log)) >= 50, what="some jobs to run")
    # When the active one is killed with SIGKILL
    first.kill()
    started_before = Counter(job_id for job_id, _ in executions(log))
    # Then the standby takes over, the workers find it, and every job succeeds: none lost
    second.wait_serving(30)
    (leading,) = second.events("store_leading")
    assert leading["waited"] is True
    done = wait_all_done(second, [j.id for j in jobs], timeout=180)
    assert Counter(j.state for j in done) == {S.SUCCEEDED: 600}
    runs = Counter(job_id for job_id, _ in executions(log))
    assert set(runs) == {j.id for j in jobs}
    # and a job ran twice only if it had started before the kill
    reruns = {job_id for job_id, n in runs.items() if n > 1}
    assert reruns <= set(started_before), f"re-ran jobs that had not started: {reruns - set(started_before)}"
    assert {w.id for w in second.workers()} == {w.id for w in second.workers() if w.state != w.UNAVAILABLE}
    print(f"\ntakeover with 600 jobs: {len(started_before)} had started, {len(reruns)} re-ran")


def test_an_active_control_plane_that_loses_its_database_session_stops_and_the_standby_takes_over(
    pair: tuple[ControlProc, ControlProc, str], postgres: Cluster, spawn_worker: Any, tmp_path: Path
) -> None:
    # Given an active control plane with a worker, and a standby
    first, second, url = pair
    second.start(wait=False)
    wait_until(lambda: _standing_by(second), 20, what="the second control plane to stand by")
    spawn_worker(first, threads=2, address=f"{first.address},{second.address}")
    # When the active one's database session is ended (its lock goes with it) while it is idle
    postgres.sql(
        url, f"SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND objid = {LOCK_KEY}"
    )
    # Then it stops on its own with the store's exit status, and the standby leads and runs new jobs
    assert first.proc is not None
    assert first.proc.wait(20) == 3
    second.wait_serving(30)
    log = tmp_path / "runs.log"
    jobs = submit_many(second, [request("record", {"path": str(log), "seconds": 0}) for _ in range(10)])
    done = wait_all_done(second, [j.id for j in jobs], timeout=60)
    assert Counter(j.state for j in done) == {S.SUCCEEDED: 10}
