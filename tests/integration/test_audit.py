"""The audit log on a real control plane and a real worker: what is recorded, allowed or refused,
who may read it, and that it is kept across a restart. The same through gRPC, REST, the Python
clients and the CLI; bad filters are refused naming the field."""

from __future__ import annotations

import asyncio
import json
import secrets
from dataclasses import dataclass
from typing import Any

import pytest

import corral
from corral.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    RateLimited,
    Unauthenticated,
)
from tests.conftest import ControlProc
from tests.integration.test_rest import Rest
from tests.support import cli


def _token() -> str:
    return secrets.token_urlsafe(24)


@dataclass
class Tenants:
    cp: ControlProc
    tokens: dict[str, str]

    def client(self, name: str) -> corral.Client:
        return corral.Client(self.cp.address, token=self.tokens[name])


@pytest.fixture
def tenants(make_control_plane: Any, spawn_worker: Any) -> Tenants:
    tokens = {name: _token() for name in ("alice", "bob", "ops", "worker")}
    cp = make_control_plane(
        CORRAL_AUTH_TOKENS=",".join(f"{n}:{tokens[n]}" for n in ("alice", "bob", "ops")),
        CORRAL_WORKER_TOKEN=tokens["worker"],
        CORRAL_JOB_VISIBILITY="owner",
        CORRAL_AUTH_ADMINS="ops",
        CORRAL_ACCOUNTS="admin",
        CORRAL_PASSWORD_ROUNDS="10",
    )
    cp.token = tokens["ops"]
    spawn_worker(cp, threads=1, env={"CORRAL_WORKER_TOKEN": tokens["worker"]})
    return Tenants(cp, tokens)


def _events(page: corral.AuditPage) -> list[tuple[str, str, str, str]]:
    return [(e.actor, e.action, e.target, e.outcome) for e in page.events]


def test_changes_and_refusals_are_recorded_with_who_what_and_the_request_id(tenants: Tenants) -> None:
    with tenants.client("alice") as alice, tenants.client("bob") as bob, tenants.client("ops") as ops:
        job = alice.submit("sleep", {"seconds": 30})
        with pytest.raises(NotFound):
            bob.cancel(job.id)  # another's job is a missing one, and the attempt is on record
        cancelled = alice.cancel(job.id)
        assert cancelled.state.name == "CANCELLED"
        with pytest.raises(FailedPrecondition):
            alice.retry(job.id)  # only a FAILED job is retried
        with pytest.raises(NotFound):
            ops.drain_worker("no-such-worker")
        with pytest.raises(PermissionDenied):
            bob.audit()
        page = ops.audit()
    assert _events(page) == [
        ("ops", "worker.drain", "no-such-worker", "NOT_FOUND"),
        ("alice", "job.retry", job.id, "FAILED_PRECONDITION"),
        ("alice", "job.cancel", job.id, "OK"),
        ("bob", "job.cancel", job.id, "NOT_FOUND"),
    ]
    assert page.total == 4
    assert [e.seq for e in page.events] == sorted((e.seq for e in page.events), reverse=True)
    times = [e.time for e in page.events]
    assert times == sorted(times, reverse=True)
    assert all(e.request_id for e in page.events)
    # The request id is the one the call's log lines carry.
    log = tenants.cp.log.read_text()
    cancel = next(e for e in page.events if e.outcome == "OK")
    assert f'"request_id": "{cancel.request_id}"' in log or f'"request_id":"{cancel.request_id}"' in log


def test_logins_registrations_and_account_changes_are_recorded(tenants: Tenants) -> None:
    with tenants.client("ops") as ops:
        ops.register("carol", "correct horse")
    with corral.Client(tenants.cp.address) as anonymous:
        with pytest.raises(Unauthenticated):
            anonymous.login("carol", "a wrong guess")
        token = anonymous.login("carol", "correct horse").token
    with corral.Client(tenants.cp.address, token=token) as carol:
        carol.set_password("carol", "battery staple", current_password="correct horse")
    with tenants.client("ops") as ops:
        ops.delete_account("carol")
        page = ops.audit()
        only_logins = ops.audit(action="account.login")
        refused = ops.audit(outcome="UNAUTHENTICATED")
    assert _events(page) == [
        ("ops", "account.delete", "carol", "OK"),
        ("carol", "account.set_password", "carol", "OK"),
        ("", "account.login", "carol", "OK"),
        ("", "account.login", "carol", "UNAUTHENTICATED"),
        ("ops", "account.register", "carol", "OK"),
    ]
    assert _events(only_logins) == [e for e in _events(page) if e[1] == "account.login"]
    assert _events(refused) == [e for e in _events(page) if e[3] == "UNAUTHENTICATED"]
    assert "correct horse" not in tenants.cp.db.read_bytes().decode("latin-1")


def test_callers_without_credentials_cannot_fill_the_log_with_free_refusals(tenants: Tenants) -> None:
    # Login and Register need no token; a refusal that took no password hash is not recorded for them,
    # so the log grows no faster than hashing allows.
    with corral.Client(tenants.cp.address) as anonymous:
        for n in range(30):
            with pytest.raises(Unauthenticated):
                anonymous.register(f"mallory{n}", "correct horse")  # registration is for admins here
        for _ in range(5):
            with pytest.raises(Unauthenticated):
                anonymous.login("nobody", "a guess")  # a name no account has: hashed all the same, recorded
        for _ in range(10):
            with pytest.raises(RateLimited):
                anonymous.login("nobody", "a guess")  # throttled: free, not recorded
    with tenants.client("ops") as ops:
        page = ops.audit()
        # An admin's refusal is recorded: the caller is known.
        with pytest.raises(AlreadyExists):
            ops.register("ops", "correct horse")
        assert ops.audit(actor="ops").total == 1
    assert page.total == 5  # the 5 login attempts before the name was throttled
    assert {(e.actor, e.action, e.outcome) for e in page.events} == {("", "account.login", "UNAUTHENTICATED")}


def test_the_log_is_kept_across_a_restart_and_paged(tenants: Tenants) -> None:
    with tenants.client("bob") as bob:
        for n in range(5):
            with pytest.raises(NotFound):
                bob.cancel(f"job-{n}")
    tenants.cp.stop()
    tenants.cp.start()
    with tenants.client("ops") as ops:
        first = ops.audit(actor="bob", limit=2)
        rest = ops.audit(actor="bob", limit=10, offset=2)
        assert ops.audit(actor="alice").total == 0
    assert first.total == rest.total == 5
    assert [e.target for e in first.events + rest.events] == [f"job-{n}" for n in reversed(range(5))]


def test_bad_filters_are_refused_naming_the_field(tenants: Tenants) -> None:
    with tenants.client("ops") as ops:
        for kwargs, field in (
            ({"limit": 1001}, "limit"),
            ({"offset": -1}, "offset"),
            ({"action": "job.delete"}, "action"),
            ({"actor": "x" * 257}, "actor"),
            ({"target": "a\x00b"}, "target"),
        ):
            with pytest.raises(InvalidArgument) as caught:
                ops.audit(**kwargs)
            assert caught.value.field == field, kwargs


def test_rest_the_async_client_and_the_cli_read_the_same_log(tenants: Tenants) -> None:
    with tenants.client("bob") as bob, pytest.raises(NotFound):
        bob.cancel("job-x")
    rest = Rest(tenants.cp.http_port)
    ops_bearer = {"Authorization": f"Bearer {tenants.tokens['ops']}"}
    body = rest.get("/v1/audit?actor=bob", headers=ops_bearer).json()
    assert body["total"] == "1"  # an int64, a string in JSON (proto3 JSON mapping)
    (event,) = body["events"]
    assert (event["actor"], event["action"], event["target"], event["outcome"]) == (
        "bob",
        "job.cancel",
        "job-x",
        "NOT_FOUND",
    )
    assert rest.get("/v1/audit", headers={"Authorization": f"Bearer {tenants.tokens['bob']}"}).status == 403
    assert rest.get("/v1/audit?limit=5000", headers=ops_bearer).status == 400

    async def read() -> corral.AuditPage:
        async with corral.AsyncClient(tenants.cp.address, token=tenants.tokens["ops"]) as ops:
            return await ops.audit(actor="bob")

    assert _events(asyncio.run(read())) == [("bob", "job.cancel", "job-x", "NOT_FOUND")]
    env = {"CORRAL_CONTROL_ADDR": tenants.cp.address, "CORRAL_TOKEN": tenants.tokens["ops"]}
    done = cli.corral("audit", "--actor", "bob", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert [e["target"] for e in json.loads(done.stdout)["events"]] == ["job-x"]
    table = cli.corral("audit", "--action", "job.cancel", env=env)
    assert table.returncode == 0 and "job-x" in table.stdout and "NOT_FOUND" in table.stdout
    wrong = cli.corral("audit", "--action", "job.delete", env=env)
    assert wrong.returncode == 2 and "job.cancel" in wrong.stderr
