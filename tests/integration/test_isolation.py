"""Clients kept apart (CORRAL_JOB_VISIBILITY=owner) on a real control plane and a real worker.

Every job records its owner, the name of the client token it came with. With isolation on, another
client's job is answered exactly as a missing one on every call that names a job (gRPC and REST),
lists hold the caller's jobs only, idempotency keys are per client, AdminService is for the admins,
and all of it holds across a restart (the owner is stored with the job).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import corral
from corral.errors import NotFound, PermissionDenied
from tests.conftest import ControlProc, wait_until
from tests.integration.test_rest import Rest
from tests.support import cli


def _token() -> str:
    return secrets.token_urlsafe(24)


@dataclass
class Tenants:
    cp: ControlProc
    alice: corral.Client
    bob: corral.Client
    ops: corral.Client
    """An admin (CORRAL_AUTH_ADMINS)."""
    tokens: dict[str, str]


@pytest.fixture
def tenants(make_control_plane: Any, spawn_worker: Any) -> Any:
    tokens = {name: _token() for name in ("alice", "bob", "ops", "worker")}
    cp = make_control_plane(
        CORRAL_AUTH_TOKENS=",".join(f"{n}:{tokens[n]}" for n in ("alice", "bob", "ops")),
        CORRAL_WORKER_TOKEN=tokens["worker"],
        CORRAL_JOB_VISIBILITY="owner",
        CORRAL_AUTH_ADMINS="ops",
    )
    cp.token = tokens["ops"]
    spawn_worker(cp, threads=2, env={"CORRAL_WORKER_TOKEN": tokens["worker"]})
    clients = {n: corral.Client(cp.address, token=tokens[n]) for n in ("alice", "bob", "ops")}
    yield Tenants(cp, clients["alice"], clients["bob"], clients["ops"], tokens)
    for c in clients.values():
        c.close()


def _done(client: corral.Client) -> corral.Job:
    """A noop job of ``client``'s, once it has succeeded."""
    done = client.wait(client.submit("noop").id, timeout=30)
    assert done.state.name == "SUCCEEDED"
    return done


def _refused_as_missing(client: corral.Client, job_id: str) -> None:
    """Every call naming ``job_id`` fails as it does for an id that does not exist, word for word."""
    missing = "f" * 32
    calls = (
        client.get,
        client.cancel,
        client.retry,
        lambda i: list(client.watch(i)),
        lambda i: list(client.watch_output(i)),
        lambda i: list(client.watch_many([i])),
        lambda i: client.wait_all([i]),
    )
    for call in calls:
        with pytest.raises(NotFound) as theirs:
            call(job_id)
        with pytest.raises(NotFound) as none:
            call(missing)
        assert str(theirs.value).replace(job_id, "ID") == str(none.value).replace(missing, "ID")


def test_a_client_sees_and_manages_only_its_own_jobs(tenants: Tenants) -> None:
    # Given jobs of alice (one running, one done) and one of bob
    running = tenants.alice.submit("sleep", {"seconds": 30})
    done = _done(tenants.alice)
    bobs = _done(tenants.bob)
    assert (running.owner, done.owner, bobs.owner) == ("alice", "alice", "bob")
    wait_until(lambda: tenants.alice.get(running.id).state.name == "RUNNING", what="alice's job to run")
    # Then bob cannot read, watch (its changes or its output), cancel or retry alice's jobs: to him they
    # do not exist
    for job in (running, done):
        _refused_as_missing(tenants.bob, job.id)
    # not even beside one of his own in a watch of many
    with pytest.raises(NotFound, match=done.id):
        tenants.bob.wait_all([bobs.id, done.id])
    assert [j.id for j in tenants.bob.wait_all([bobs.id])] == [bobs.id]
    # and his list holds his job alone, whatever owner he asks for
    page = tenants.bob.list()
    assert ([j.id for j in page.jobs], page.total) == ([bobs.id], 1)
    assert tenants.bob.list(owner="alice").total == 0
    assert {j.id for j in tenants.alice.list().jobs} == {running.id, done.id}
    # while alice's running job runs on, untouched by bob's cancel
    assert tenants.alice.get(running.id).state.name == "RUNNING"
    # and the admin sees everyone's, filters by owner, and manages alice's job
    assert tenants.ops.list().total == 3
    assert {j.id for j in tenants.ops.list(owner="alice").jobs} == {running.id, done.id}
    assert tenants.ops.cancel(running.id).state.name == "CANCELLED"


def test_admin_service_is_for_admins_only(tenants: Tenants) -> None:
    with pytest.raises(PermissionDenied, match="CORRAL_AUTH_ADMINS"):
        tenants.bob.workers()
    assert len(tenants.ops.workers()) == 1


def test_idempotency_keys_are_each_client_s_own(tenants: Tenants) -> None:
    # Given alice and bob both use the key "order-42", for different jobs
    a = tenants.alice.submit("add_numbers", {"a": 1, "b": 2}, idempotency_key="order-42")
    b = tenants.bob.submit("add_numbers", {"a": 5, "b": 5}, idempotency_key="order-42")
    # Then each got a job of their own (no conflict, and bob is not handed alice's job)
    assert a.id != b.id and (a.owner, b.owner) == ("alice", "bob")
    # and a replay still finds the client's own job
    assert tenants.alice.submit("add_numbers", {"a": 1, "b": 2}, idempotency_key="order-42").id == a.id
    assert tenants.bob.submit("add_numbers", {"a": 5, "b": 5}, idempotency_key="order-42").id == b.id


@pytest.mark.parametrize("limit", [30.0, None], ids=["RunJob", "RunJobs"])
def test_run_makes_the_caller_s_job_and_replays_only_the_caller_s_key(tenants: Tenants, limit: float | None) -> None:
    # Given a job alice ran with run() and a key (in one RunJob call, or on her kept RunJobs stream)
    ran = tenants.alice.run("add_numbers", {"a": 1, "b": 2}, idempotency_key="run-42", timeout=limit)
    assert ran.owner == "alice" and ran.result == {"sum": 3}
    # Then it is hers alone, and bob's run with the same key makes a job of his own
    _refused_as_missing(tenants.bob, ran.id)
    bobs = tenants.bob.run("add_numbers", {"a": 5, "b": 5}, idempotency_key="run-42", timeout=limit)
    assert bobs.id != ran.id and bobs.owner == "bob" and bobs.result == {"sum": 10}
    assert tenants.alice.run("add_numbers", {"a": 1, "b": 2}, idempotency_key="run-42", timeout=limit).id == ran.id


def test_rest_follows_the_same_rules(tenants: Tenants) -> None:
    rest = Rest(tenants.cp.http_port)
    alice = {"Authorization": f"Bearer {tenants.tokens['alice']}"}
    bob = {"Authorization": f"Bearer {tenants.tokens['bob']}"}
    job = rest.submit({"type": "noop"}, headers=alice)
    assert job["owner"] == "alice"
    for method, path in (
        ("GET", f"/v1/jobs/{job['id']}"),
        ("POST", f"/v1/jobs/{job['id']}:cancel"),
        ("POST", f"/v1/jobs/{job['id']}:retry"),
        ("GET", f"/v1/jobs/{job['id']}:watch"),
        ("GET", f"/v1/jobs/{job['id']}:watchOutput"),
    ):
        reply = rest.call(method, path, headers=bob)
        streamed = method == "GET" and path.endswith(("watch", "watchOutput"))
        assert reply.status == 404 or (streamed and b'"code":5' in reply.body), (
            method,
            path,
            reply.status,
            reply.body,
        )
    listed = rest.get("/v1/jobs?owner=alice", headers=bob).json()
    assert listed.get("jobs", []) == [] and int(listed.get("total", 0)) == 0
    # A malformed listing is refused the same whoever it names (it was an empty page for another's jobs)
    for query in ("order=QUEUE&status=SUCCEEDED", "order=QUEUE&errorCode=TIMEOUT"):
        for owner in ("alice", "bob"):
            reply = rest.get(f"/v1/jobs?{query}&owner={owner}", headers=bob)
            assert reply.status == 400 and reply.violation() in ("status", "error_code"), (query, owner, reply.body)
    assert rest.get("/v1/workers", headers=bob).status == 403


def test_owners_survive_a_restart(tenants: Tenants, tmp_path: Path) -> None:
    # Given a job of alice's, then a restart of the control plane on the same database
    job = _done(tenants.alice)
    tenants.cp.stop()
    tenants.cp.start()
    # Then it is still hers: bob cannot see it, alice and the admin can
    with corral.Client(tenants.cp.address, token=tenants.tokens["bob"]) as bob:
        _refused_as_missing(bob, job.id)
    with corral.Client(tenants.cp.address, token=tenants.tokens["alice"]) as alice:
        assert alice.get(job.id).owner == "alice"
    with corral.Client(tenants.cp.address, token=tenants.tokens["ops"]) as ops:
        assert [j.id for j in ops.list(owner="alice").jobs] == [job.id]


def test_without_isolation_every_client_sees_every_job_and_its_owner(make_control_plane: Any) -> None:
    alice, bob, worker = _token(), _token(), _token()
    cp = make_control_plane(CORRAL_AUTH_TOKENS=f"alice:{alice},bob:{bob}", CORRAL_WORKER_TOKEN=worker)
    with corral.Client(cp.address, token=alice) as a, corral.Client(cp.address, token=bob) as b:
        job = a.submit("noop")
        assert b.get(job.id).owner == "alice"
        assert [j.id for j in b.list(owner="alice").jobs] == [job.id]
        assert b.list(owner="bob").total == 0


def test_the_cli_lists_by_owner_and_shows_it(tenants: Tenants) -> None:
    job = _done(tenants.alice)
    _done(tenants.bob)
    address = ("--control", tenants.cp.address)
    # the admin lists alice's jobs alone, with their owner
    listed = cli.corral("list", "--owner", "alice", "--json", *address, f"--token={tenants.tokens['ops']}")
    assert listed.returncode == 0, listed.stderr
    page = json.loads(listed.stdout)
    assert ([j["id"] for j in page["jobs"]], [j["owner"] for j in page["jobs"]]) == ([job.id], ["alice"])
    table = cli.corral("list", *address, f"--token={tenants.tokens['ops']}")
    assert "owner" in table.stdout and "alice" in table.stdout and "bob" in table.stdout
    # bob is told the job does not exist, in one line
    refused = cli.corral("get", job.id, *address, f"--token={tenants.tokens['bob']}")
    assert refused.returncode != 0 and refused.stdout == ""
    assert f"job {job.id!r} not found" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1


def test_with_group_visibility_a_group_shares_its_jobs(make_control_plane: Any, spawn_worker: Any) -> None:
    # Given alice and bob in one group, carol in another
    tokens = {name: _token() for name in ("alice", "bob", "carol", "ops", "worker")}
    cp = make_control_plane(
        CORRAL_AUTH_TOKENS=",".join(f"{n}:{tokens[n]}" for n in ("alice", "bob", "carol", "ops")),
        CORRAL_WORKER_TOKEN=tokens["worker"],
        CORRAL_JOB_VISIBILITY="group",
        CORRAL_GROUPS="physics=alice,bob;bio=carol",
        CORRAL_AUTH_ADMINS="ops",
    )
    cp.token = tokens["ops"]  # the fixtures' own calls (is the worker registered?) are an admin's
    spawn_worker(cp, threads=1, env={"CORRAL_WORKER_TOKEN": tokens["worker"]})
    clients = {n: corral.Client(cp.address, token=tokens[n]) for n in ("alice", "bob", "carol")}
    try:
        # When alice submits a job
        job = clients["alice"].submit("sleep", {"seconds": 30})
        # Then bob, in her group, sees it, lists it and may cancel it
        assert clients["bob"].get(job.id).owner == "alice"
        assert [j.id for j in clients["bob"].list().jobs] == [job.id]
        # while to carol it does not exist
        _refused_as_missing(clients["carol"], job.id)
        assert clients["carol"].list().total == 0
        assert clients["bob"].cancel(job.id).state.name == "CANCELLED"
    finally:
        for c in clients.values():
            c.close()
