"""An upgrade in place: a database an old release wrote, opened by the current control plane.

Each case is a fixture of ``tests/fixtures/upgrade`` (made by ``tests/support/make_upgrade_fixture.py``
from a past commit, so that CI needs neither git history nor old trees): jobs in every state, stopped
with SIGTERM (``-clean``) or killed with ``kill -9`` mid-work (``-kill``). The releases span the schema's
history: 9a0217a (before owners, output, dependencies, GPUs, accounts, the label index), 8f0de7b (before the
label index), 8f1c9f1 (before the schema version; killed) and 4697baa (schema version 1).

These guard what held when they were written (no fix was needed for them): every job reads back as
that release left it, field by field, and runs on as the README promises after a restart.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from corral.v1 import accounts_pb2, accounts_pb2_grpc, admin_pb2, jobs_pb2
from tests.conftest import wait_until
from tests.support.upgrade import ANSWERED_SINCE, DERIVED, SUBMITTED, Fixture, as_dict, names, same_times

S = jobs_pb2.Job
TERMINAL = {S.SUCCEEDED, S.FAILED, S.CANCELLED}
FINISHED_ROLES = ("succeeded", "printed", "dead", "dead_retried", "cancelled")


@pytest.fixture(params=names())
def fixture(request: pytest.FixtureRequest) -> Fixture:
    return Fixture(request.param)


def test_the_fixtures_are_all_there() -> None:
    # An empty list would leave the tests below with no case, skipped without a word (a fixture lost to a
    # .gitignore rule, say): each release's database and its JSON must be there.
    assert names() == ["4697baa-clean", "8f0de7b-clean", "8f1c9f1-kill", "9a0217a-clean"]
    for name in names():
        assert Fixture(name).manifest["release"] == name.split("-")[0]


def _due(before: dict[str, Any]) -> bool:
    """Whether a job the old release held SCHEDULED has come due since."""
    at = before.get("scheduled_at")
    return before["state"] == "SCHEDULED" and at is not None and _seconds(at) <= time.time()


def _seconds(rfc3339: str) -> float:
    ts = Timestamp()
    ts.FromJsonString(rfc3339)
    return ts.ToNanoseconds() / 1e9


def _stored_states(db: Path) -> dict[str, int]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return {S.State.Name(state): n for state, n in conn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state")}


def test_every_job_reads_back_as_the_old_release_left_it(fixture: Fixture, tmp_path: Path) -> None:
    # Given the database of an old release, with jobs in every state (and, if it was killed, mid-work)
    # When the current release opens it, with no worker yet (a heartbeat timeout long enough that the
    # RUNNING job's absent worker is not reaped while this reads)
    cp = fixture.open(tmp_path / "control", WORKER_HEARTBEAT_TIMEOUT_SEC="10", CORRAL_LEASE_GRACE_SEC="10")
    try:
        meta = fixture.metadata()
        now = {
            role: as_dict(cp.jobs.GetJob(jobs_pb2.GetJobRequest(id=i), metadata=meta, timeout=10))
            for role, i in fixture.ids.items()
        }
        # Then every job has every field as the old release answered it
        for role, before in fixture.before.items():
            after = now[role]
            kept: set[str]
            if role in fixture.manifest["in_flux"]:  # moved on after its snapshot: what it was given stays
                kept = set(SUBMITTED)
            elif _due(before):  # came due while stored: queued at the open (ready since then), all else as it was
                assert after["state"] == "PENDING", role
                kept = (set(before) | set(after)) - {"state", "ready_at"}
            else:
                kept = set(before) | set(after)
            kept -= DERIVED
            kept -= ANSWERED_SINCE - set(before)
            assert 0 <= int(after.get("charged_attempts", 0)) <= int(after.get("attempts", 0)), role
            after = same_times(after, before)
            assert {k: after.get(k) for k in kept} == {k: before.get(k) for k in kept}, role
        # and the jobs of a burst cut short by the kill are all there, each where the crash left it
        burst = [cp.get(i) for i in fixture.manifest["burst"]]
        assert [j.name for j in burst] == [f"upgrade-burst-{i}" for i in range(len(burst))]
        if fixture.killed:
            assert {j.state for j in burst} <= {S.PENDING, S.RUNNING, S.SUCCEEDED}
            assert sum(j.state == S.SUCCEEDED for j in burst) >= 5  # those the old release said succeeded
        # and the counts are those of the jobs read back, which for a clean stop are the old release's own
        stats = cp.jobs.GetStats(jobs_pb2.GetStatsRequest(), metadata=meta, timeout=10)
        counts = {k: v for k, v in stats.jobs_by_status.items() if v}
        assert stats.dead_letter == counts["FAILED"] == 2
        if not fixture.killed:
            old = {k: int(v) for k, v in fixture.manifest["stats"]["jobsByStatus"].items() if int(v)}
            due = sum(_due(b) for b in fixture.before.values())
            assert counts == {**old, "SCHEDULED": old["SCHEDULED"] - due, "PENDING": old["PENDING"] + due}
        listed = cp.jobs.ListJobs(jobs_pb2.ListJobsRequest(limit=1000), metadata=meta, timeout=10)
        assert listed.total == len(listed.jobs) == sum(counts.values()) == len(fixture.ids) + len(burst)
        # and a search by label (the label index, built from the old rows where the release had none) finds
        # exactly the jobs with that label
        by_label = cp.jobs.ListJobs(jobs_pb2.ListJobsRequest(labels={"team": "edge"}, limit=100), metadata=meta)
        edge = {r for r, b in fixture.before.items() if b.get("labels", {}).get("team") == "edge"}
        assert {j.id for j in by_label.jobs} == {fixture.ids[r] for r in edge} and by_label.total == len(edge)
    finally:
        stopped = cp.stop()
    # and a clean stop leaves in the file what was read back
    assert stopped == 0
    assert _stored_states(cp.db) == counts


def test_the_old_release_s_jobs_run_on_once_each_after_the_upgrade(
    fixture: Fixture, tmp_path: Path, spawn_worker: Any
) -> None:
    # Given the database of an old release, whose RUNNING jobs' worker is gone for good (it was killed)
    cp = fixture.open(tmp_path / "control")
    try:
        meta = fixture.metadata()

        def job(role: str) -> jobs_pb2.Job:
            found: jobs_pb2.Job = cp.jobs.GetJob(
                jobs_pb2.GetJobRequest(id=fixture.ids[role]), metadata=meta, timeout=10
            )
            return found

        running_at_open = {i for i in fixture.manifest["burst"] if cp.get(i).state == S.RUNNING}
        finished = {role: as_dict(job(role)) for role in FINISHED_ROLES}
        # When a worker of the current release joins
        worker = spawn_worker(cp, threads=2, slots=2, env={"CORRAL_WORKER_TOKEN": fixture.manifest["worker_token"]})
        # Then the RUNNING job, its worker silent past the heartbeat timeout, counts a lost attempt and runs
        # again, on the new worker (README: Lost workers)
        wait_until(lambda: job("running").attempts == 2 and job("running").worker_id == worker.worker_id, 20)
        assert [e["worker_id"] for e in cp.events("worker_stale")] == [fixture.manifest["worker_id"]]
        assert job("running").state == S.RUNNING
        # and every queued job runs once and succeeds, the one that came due while stored included
        stays_pending = {
            r
            for r in ("pending_selector", "pending_resources")
            if fixture.carried("worker_selector" if r == "pending_selector" else "gpu_count")
        }
        stays_scheduled = {"scheduled_far"} | ({"scheduled_after_far"} if fixture.carried("depends_on") else set())
        queued = [r for r, b in fixture.before.items() if b["state"] in ("PENDING", "SCHEDULED")]
        runs = [r for r in queued if r not in stays_pending | stays_scheduled]

        def ended(job_id: str) -> Callable[[], bool]:
            return lambda: cp.get(job_id).state in TERMINAL

        for role in runs:
            wait_until(ended(fixture.ids[role]), 20, what=f"{role} to end")
            assert (S.State.Name(job(role).state), job(role).attempts) == ("SUCCEEDED", 1), role
        assert job("pending").result["sum"] == 5 and job("scheduled_soon").result["sum"] == 8
        # and so does the burst a kill cut short: once each, twice only for those running at the kill
        # (their worker was killed with it: README: a new process does not know what the old one ran)
        for job_id in fixture.manifest["burst"]:
            wait_until(ended(job_id), 20, what=f"{job_id} of the burst to end")
            done = cp.get(job_id)
            assert (done.state, done.attempts) == (S.SUCCEEDED, 2 if job_id in running_at_open else 1)
        # and what cannot run here waits, and what finished before stays as it was
        assert {r for r in stays_pending if job(r).state == S.PENDING} == stays_pending
        assert {r for r in stays_scheduled if job(r).state == S.SCHEDULED} == stays_scheduled
        assert {role: as_dict(job(role)) for role in FINISHED_ROLES} == finished
        # and an idempotency key the old release stored still finds its job, and still refuses another request
        for role in fixture.manifest["requests"]:
            request, who = fixture.replay(role)
            assert cp.jobs.SubmitJob(request, metadata=who, timeout=10).job.id == fixture.ids[role], role
            request.priority += 1
            with pytest.raises(grpc.RpcError) as refused:
                cp.jobs.SubmitJob(request, metadata=who, timeout=10)
            assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS, role
        # and its accounts still log in, and its audit log is still there
        if fixture.manifest["account"]:
            accounts = accounts_pb2_grpc.AccountServiceStub(cp.channel())
            login = accounts.Login(accounts_pb2.LoginRequest(name="carol", password="carol-password-1"), timeout=10)
            assert login.token
            audit = cp.admin.ListAuditEvents(admin_pb2.ListAuditEventsRequest(action="job.cancel"), metadata=meta)
            assert [(e.actor, e.target) for e in audit.events][-1] == ("alice", fixture.ids["cancelled"])
        cp.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=fixture.ids["running"]), metadata=meta, timeout=10)
    finally:
        cp.stop()
