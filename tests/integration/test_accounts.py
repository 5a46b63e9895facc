"""Accounts (CORRAL_ACCOUNTS) on a real control plane and a real worker on 127.0.0.1.

People register, log in with a password and use the login as their token: their jobs are theirs
(owner, visibility), the login outlives a restart of the control plane and ends with a new password
or a deleted account; admins manage accounts where registration is closed. The same through gRPC,
REST, the Python client and the CLI; bad input is refused naming the field, and stores nothing.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

import corral
from corral.errors import AlreadyExists, InvalidArgument, NotFound, PermissionDenied, RateLimited, Unauthenticated
from corral.v1 import accounts_pb2, accounts_pb2_grpc
from tests.conftest import ControlProc, wait_until
from tests.integration.test_health_metrics import scrape
from tests.integration.test_rest import Rest
from tests.support import cli

PASSWORD = "correct horse"
TTL = 600


def _token() -> str:
    return secrets.token_urlsafe(24)


@dataclass
class Site:
    cp: ControlProc
    ops: str
    """A configured client token, named in CORRAL_AUTH_ADMINS."""
    worker: str


def _site(make_control_plane: Any, spawn_worker: Any, mode: str, **env: str) -> Site:
    ops, worker = _token(), _token()
    cp = make_control_plane(
        CORRAL_ACCOUNTS=mode,
        CORRAL_AUTH_TOKENS=f"ops:{ops}",
        CORRAL_WORKER_TOKEN=worker,
        CORRAL_JOB_VISIBILITY="owner",
        CORRAL_AUTH_ADMINS="ops",
        CORRAL_LOGIN_TTL_SEC=str(TTL),
        CORRAL_PASSWORD_ROUNDS="10",
        **env,
    )
    cp.token = ops
    spawn_worker(cp, threads=2, env={"CORRAL_WORKER_TOKEN": worker})
    return Site(cp, ops, worker)


@pytest.fixture
def open_site(make_control_plane: Any, spawn_worker: Any) -> Site:
    return _site(make_control_plane, spawn_worker, "open")


def _login(cp: ControlProc, name: str, password: str = PASSWORD) -> corral.Client:
    with corral.Client(cp.address) as anonymous:
        grant = anonymous.login(name, password)
    return corral.Client(cp.address, token=grant.token)


def test_people_register_log_in_and_own_their_jobs(open_site: Site) -> None:
    cp = open_site.cp
    with corral.Client(cp.address) as anonymous:
        account = anonymous.register("alice", PASSWORD)
        anonymous.register("bob", "battery staple")
        assert account.name == "alice" and not account.admin and account.created_at is not None
        before = time.time()
        grant = anonymous.login("alice", PASSWORD)
        assert grant.account.name == "alice"
        assert before + TTL - 5 <= grant.expires_at.timestamp() <= time.time() + TTL + 5
        assert grant.token not in repr(grant)
        with pytest.raises(Unauthenticated):  # a login is needed for everything but Login and Register
            anonymous.submit("noop")
    with corral.Client(cp.address, token=grant.token) as alice, _login(cp, "bob", "battery staple") as bob:
        me = alice.whoami()
        assert me.name == "alice" and not me.admin and me.account is not None
        assert me.expires_at is not None and abs(me.expires_at.timestamp() - grant.expires_at.timestamp()) < 1
        job = alice.wait(alice.submit("noop").id, timeout=30)
        assert job.state.name == "SUCCEEDED" and job.owner == "alice"
        # CORRAL_JOB_VISIBILITY=owner holds for accounts as for tokens.
        with pytest.raises(NotFound):
            bob.get(job.id)
        assert bob.list().total == 0
        with pytest.raises(PermissionDenied, match="CORRAL_AUTH_ADMINS"):
            bob.accounts()
    with corral.Client(cp.address, token=open_site.ops) as ops:
        assert [(a.name, a.admin) for a in ops.accounts()] == [("alice", False), ("bob", False)]
        assert ops.whoami().admin and ops.whoami().account is None
        assert ops.get(job.id).owner == "alice"


def test_a_wrong_name_or_password_is_refused_alike_and_guessing_is_slowed(open_site: Site) -> None:
    cp = open_site.cp
    with corral.Client(cp.address) as anonymous:
        anonymous.register("alice", PASSWORD)
        messages = set()
        for name, password in (("alice", "wrong password"), ("nobody", PASSWORD)):
            with pytest.raises(Unauthenticated) as caught:
                anonymous.login(name, password)
            messages.add(str(caught.value))
        assert messages == {"wrong name or password"}
        for _ in range(4):
            with pytest.raises(Unauthenticated):
                anonymous.login("alice", "wrong password")
        with pytest.raises(RateLimited, match="try again in") as throttled:
            anonymous.login("alice", PASSWORD)
        assert 0 < throttled.value.retry_after <= 60
    log = cp.log.read_text()
    assert '"login_refused"' in log and "wrong password" not in log and PASSWORD not in log
    metrics = scrape(Rest(cp.http_port))
    assert metrics['corral_logins_total{outcome="refused"}'] == 6
    assert metrics['corral_logins_total{outcome="throttled"}'] == 1
    assert metrics['corral_logins_total{outcome="ok"}'] == 0


def test_bad_input_is_refused_naming_the_field_and_stores_nothing(open_site: Site) -> None:
    cp = open_site.cp
    with corral.Client(cp.address) as anonymous:
        cases = [
            ("", PASSWORD, "name"),
            ("al ice", PASSWORD, "name"),
            ("ålice", PASSWORD, "name"),
            ("x" * 65, PASSWORD, "name"),
            ("alice", "short", "password"),
            ("alice", "p" * 73, "password"),
            ("alice", "ü" * 40, "password"),
        ]
        for name, password, field in cases:
            with pytest.raises(InvalidArgument) as caught:
                anonymous.register(name, password)
            assert caught.value.field == field, (name, password)
        anonymous.register("alice", "pässwörd")  # 10 bytes of UTF-8
        with pytest.raises(AlreadyExists):
            anonymous.register("alice", PASSWORD)
        with pytest.raises(AlreadyExists, match="configured client token"):
            anonymous.register("ops", PASSWORD)
    with corral.Client(cp.address, token=open_site.ops) as ops:
        assert [a.name for a in ops.accounts()] == ["alice"]
    # REST: malformed JSON and wrong types are 400s naming the problem, and store nothing either.
    rest = Rest(cp.http_port)
    assert rest.call("POST", "/v1/accounts", raw=b'{"name": "bob",').status == 400
    wrong_type = rest.call("POST", "/v1/accounts", {"name": 7, "password": PASSWORD})
    assert wrong_type.status == 400 and "name" in wrong_type.json()["message"]
    with corral.Client(cp.address, token=open_site.ops) as ops:
        assert [a.name for a in ops.accounts()] == ["alice"]


def test_a_new_password_or_a_deleted_account_ends_its_logins(open_site: Site) -> None:
    cp = open_site.cp
    with corral.Client(cp.address) as anonymous:
        anonymous.register("alice", PASSWORD)
    alice = _login(cp, "alice")
    with pytest.raises(PermissionDenied, match="current_password"):
        alice.set_password("alice", "battery staple", current_password="not the password")
    alice.whoami()  # a refused change ends nothing
    alice.set_password("alice", "battery staple", current_password=PASSWORD)
    with pytest.raises(Unauthenticated, match="ended"):
        alice.whoami()
    alice.close()
    with pytest.raises(Unauthenticated):
        _login(cp, "alice").close()
    alice = _login(cp, "alice", "battery staple")
    # An admin resets a password without the current one; an account may not touch another's.
    with corral.Client(cp.address) as anonymous:
        anonymous.register("bob", PASSWORD)
    with _login(cp, "bob") as bob:
        with pytest.raises(PermissionDenied):
            bob.set_password("alice", "mallory's choice")
        with pytest.raises(PermissionDenied):
            bob.delete_account("alice")
    with corral.Client(cp.address, token=open_site.ops) as ops:
        ops.set_password("bob", "reset by ops")
    alice.delete_account("alice")
    with pytest.raises(Unauthenticated, match="ended"):
        alice.whoami()
    alice.close()
    with corral.Client(cp.address, token=open_site.ops) as ops:
        assert [a.name for a in ops.accounts()] == ["bob"]
        with pytest.raises(NotFound):
            ops.delete_account("alice")
    _login(cp, "bob", "reset by ops").close()


def test_an_open_run_stream_submits_nothing_once_its_login_is_ended(open_site: Site) -> None:
    # Credentials are checked when a call starts, and the client keeps its RunJobs stream open from one
    # run to the next: an account deleted since must not go on submitting in its name on it.
    cp = open_site.cp
    with corral.Client(cp.address) as anonymous:
        anonymous.register("dave", PASSWORD)
    dave = _login(cp, "dave")
    assert dave.run("noop").state is corral.JobState.SUCCEEDED  # the stream is open, and kept
    dave.delete_account("dave")
    with pytest.raises(Unauthenticated, match="ended"):
        dave.run("noop", name="after the delete")
    dave.close()
    with corral.Client(cp.address, token=open_site.ops) as ops:
        assert [(j.owner, j.name) for j in ops.list().jobs] == [("dave", "")]


def test_the_async_client_does_what_the_blocking_one_does(open_site: Site) -> None:
    address = open_site.cp.address

    async def use() -> None:
        async with corral.AsyncClient(address) as anonymous:
            assert (await anonymous.register("alice", PASSWORD)).name == "alice"
            with pytest.raises(Unauthenticated, match="wrong name or password"):
                await anonymous.login("alice", "wrong password")
            grant = await anonymous.login("alice", PASSWORD)
        async with corral.AsyncClient(address, token=grant.token) as alice:
            assert (await alice.whoami()).account == grant.account
            with pytest.raises(PermissionDenied):
                await alice.accounts()
            changed = await alice.set_password("alice", "battery staple", current_password=PASSWORD)
            assert changed.password_changed_at is not None and changed.created_at is not None
            assert changed.password_changed_at > changed.created_at
        async with corral.AsyncClient(address, token=open_site.ops) as ops:
            assert [a.name for a in await ops.accounts()] == ["alice"]
            await ops.delete_account("alice")
            with pytest.raises(NotFound):
                await ops.delete_account("alice")
            assert await ops.accounts() == []

    asyncio.run(use())


def test_an_admin_ends_every_login_at_once_and_passwords_stay(open_site: Site, tmp_path: Path) -> None:
    cp = open_site.cp
    with corral.Client(cp.address) as anonymous:
        anonymous.register("alice", PASSWORD)
    with _login(cp, "alice") as alice:
        with pytest.raises(PermissionDenied):
            alice.end_all_logins()
        alice.whoami()
        env = {
            "CORRAL_CONTROL_ADDR": cp.address,
            "CORRAL_TOKEN": open_site.ops,
            "CORRAL_LOGIN_FILE": str(tmp_path / "l"),
        }
        done = cli.corral("accounts", "end-logins", env=env)
        assert done.returncode == 0 and "Ended every login" in done.stdout, done.stderr
        with pytest.raises(Unauthenticated):
            alice.whoami()
    with _login(cp, "alice") as alice:
        assert alice.whoami().name == "alice"
    with corral.Client(cp.address, token=open_site.ops) as ops:
        assert [(e.actor, e.outcome) for e in ops.audit(action="account.end_all_logins").events] == [
            ("ops", "OK"),
            ("alice", "PERMISSION_DENIED"),
        ]


def test_a_login_outlives_a_restart_of_the_control_plane(open_site: Site) -> None:
    cp = open_site.cp
    with corral.Client(cp.address) as anonymous:
        anonymous.register("alice", PASSWORD)
        token = anonymous.login("alice", PASSWORD).token
    cp.stop()
    cp.start()
    with corral.Client(cp.address, token=token) as alice:
        assert alice.whoami().name == "alice"
        job = alice.wait(alice.submit("noop").id, timeout=30)
        assert job.owner == "alice"


def test_where_registration_is_closed_only_admins_create_accounts(make_control_plane: Any, spawn_worker: Any) -> None:
    site = _site(make_control_plane, spawn_worker, "admin")
    cp = site.cp
    with corral.Client(cp.address) as anonymous, pytest.raises(Unauthenticated, match="admin"):
        anonymous.register("alice", PASSWORD)
    with corral.Client(cp.address, token=site.ops) as ops:
        ops.register("alice", PASSWORD)
        ops.register("bob", PASSWORD)
    with _login(cp, "alice") as alice:
        with pytest.raises(PermissionDenied):
            alice.register("carol", PASSWORD)
        alice.set_password("alice", "battery staple", current_password=PASSWORD)
    with corral.Client(cp.address, token=site.ops) as ops:
        assert [a.name for a in ops.accounts()] == ["alice", "bob"]


def test_rest_registers_logs_in_and_takes_the_login_as_a_bearer_token(open_site: Site) -> None:
    rest = Rest(open_site.cp.http_port)
    made = rest.call("POST", "/v1/accounts", {"name": "alice", "password": PASSWORD})
    assert made.status == 200 and made.json()["name"] == "alice" and PASSWORD not in made.body.decode()
    refused = rest.call("POST", "/v1/login", {"name": "alice", "password": "wrong password"})
    assert refused.status == 401 and refused.json()["message"] == "wrong name or password"
    login = rest.call("POST", "/v1/login", {"name": "alice", "password": PASSWORD}).json()
    bearer = {"Authorization": f"Bearer {login['token']}"}
    assert rest.get("/v1/whoami", headers=bearer).json()["name"] == "alice"
    job = rest.call("POST", "/v1/jobs", {"type": "noop"}, headers=bearer).json()["job"]
    assert job["owner"] == "alice"
    assert rest.get("/v1/accounts", headers=bearer).status == 403
    assert rest.call("DELETE", "/v1/accounts/alice", headers=bearer).status == 200
    assert rest.get("/v1/whoami", headers=bearer).status == 401


def test_the_cli_logs_in_saves_the_login_and_uses_it(open_site: Site, tmp_path: Path) -> None:
    cp = open_site.cp
    # Every command goes to this control plane (CORRAL_CONTROL_ADDR) and keeps its login in this test's file.
    env = {"CORRAL_LOGIN_FILE": str(tmp_path / "login"), "CORRAL_CONTROL_ADDR": cp.address, "CORRAL_TOKEN": ""}
    made = cli.corral("register", "alice", "--password-stdin", env=env, input=PASSWORD)
    assert made.returncode == 0, made.stderr
    wrong = cli.corral("login", "alice", "--password-stdin", env=env, input="nope-nope")
    assert wrong.returncode != 0 and "wrong name or password" in wrong.stderr
    assert not (tmp_path / "login").exists()
    # A login that cannot be saved (CORRAL_LOGIN_FILE names a directory) is one line naming the file, not a
    # traceback after the control plane made it
    (tmp_path / "a-directory").mkdir()
    unsaved = cli.corral(
        "login",
        "alice",
        "--password-stdin",
        env={**env, "CORRAL_LOGIN_FILE": str(tmp_path / "a-directory")},
        input=PASSWORD,
    )
    assert unsaved.returncode == 1 and unsaved.stdout == ""
    assert unsaved.stderr.startswith(
        f"corral: error: logged in as alice, but the login cannot be saved to {tmp_path / 'a-directory'}: Is a directory"
    )
    assert unsaved.stderr.count("\n") == 1
    done = cli.corral("login", "alice", "--password-stdin", env=env, input=PASSWORD + "\n")
    assert done.returncode == 0, done.stderr
    assert "alice" in done.stdout and (tmp_path / "login").stat().st_mode & 0o777 == 0o600
    me = cli.corral("whoami", "--json", env=env)
    assert me.returncode == 0, me.stderr
    assert json.loads(me.stdout)["name"] == "alice"
    submitted = cli.corral("submit", "noop", "--wait", "--json", env=env)
    assert submitted.returncode == 0, submitted.stderr
    assert json.loads(submitted.stdout)["owner"] == "alice"
    out = cli.corral("logout", env=env)
    assert out.returncode == 0 and not (tmp_path / "login").exists()
    gone = cli.corral("whoami", env=env)
    assert gone.returncode != 0


def test_settings_for_accounts_are_checked_at_start() -> None:
    cases = {
        "CORRAL_ACCOUNTS=maybe": ({"CORRAL_ACCOUNTS": "maybe"}, "CORRAL_ACCOUNTS"),
        "admin without a token": ({"CORRAL_ACCOUNTS": "admin", "CORRAL_WORKER_TOKEN": _token()}, "first account"),
        "no worker token": ({"CORRAL_ACCOUNTS": "open"}, "CORRAL_WORKER_TOKEN"),
        "a TTL of a second": (
            {"CORRAL_ACCOUNTS": "open", "CORRAL_WORKER_TOKEN": _token(), "CORRAL_LOGIN_TTL_SEC": "1"},
            "CORRAL_LOGIN_TTL_SEC",
        ),
        "bcrypt's cost of 4": (
            {"CORRAL_ACCOUNTS": "open", "CORRAL_WORKER_TOKEN": _token(), "CORRAL_PASSWORD_ROUNDS": "4"},
            "CORRAL_PASSWORD_ROUNDS",
        ),
    }
    for label, (env, named) in cases.items():
        result = cli.corral("config", "--check", env=env)
        assert result.returncode == 2 and named in result.stderr, f"{label}: {result.stderr}"


def test_grpc_callers_without_accounts_get_a_clear_refusal(control_plane: ControlProc) -> None:
    stub = accounts_pb2_grpc.AccountServiceStub(control_plane.channel())
    with pytest.raises(grpc.RpcError) as caught:
        stub.Login(accounts_pb2.LoginRequest(name="alice", password=PASSWORD), timeout=10)
    err: Any = caught.value
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "CORRAL_ACCOUNTS" in err.details()
    wait_until(lambda: "control_started" in control_plane.log.read_text(), what="the log")
