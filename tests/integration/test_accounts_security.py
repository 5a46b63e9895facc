"""Open registration and anonymous logins on a real control plane on 127.0.0.1, against what a caller
without credentials could otherwise get: a name CORRAL_GROUPS lists (and with it the group's jobs), a
configured token's name, or an audit log filled with refusals that cost it nothing."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

import pytest

import corral
from corral.errors import AlreadyExists, InvalidArgument, NotFound, PermissionDenied, Unauthenticated
from tests.conftest import ControlProc
from tests.integration.test_rest import Rest

PASSWORD = "correct horse"


def _token() -> str:
    return secrets.token_urlsafe(24)


def test_a_group_member_s_name_is_not_for_anyone_to_register(make_control_plane: Any) -> None:
    # dave is listed in physics but has no account yet: whoever registered the name first would see and
    # cancel alice's jobs.
    alice, ops = _token(), _token()
    cp = make_control_plane(
        CORRAL_ACCOUNTS="open",
        CORRAL_AUTH_TOKENS=f"alice:{alice},ops:{ops}",
        CORRAL_WORKER_TOKEN=_token(),
        CORRAL_JOB_VISIBILITY="group",
        CORRAL_GROUPS="physics=alice,dave",
        CORRAL_AUTH_ADMINS="ops",
        CORRAL_PASSWORD_ROUNDS="10",
    )
    with corral.Client(cp.address, token=alice) as as_alice:
        job = as_alice.submit("noop", {"secret": "physics"}).id
    with corral.Client(cp.address) as anonymous:
        with pytest.raises(PermissionDenied, match="CORRAL_GROUPS") as caught:
            anonymous.register("dave", "squatter's password")
        assert "'physics'" in str(caught.value)
        anonymous.register("eve", PASSWORD)  # a name in no group: open registration as before
        eve_login = anonymous.login("eve", PASSWORD).token
    with corral.Client(cp.address, token=eve_login) as eve:
        with pytest.raises(PermissionDenied, match="CORRAL_GROUPS"):
            eve.register("dave", "squatter's password")  # a logged-in account does not manage accounts
        with pytest.raises(NotFound):
            eve.get(job)
    reply = Rest(cp.http_port).post("/v1/accounts", {"name": "dave", "password": "squatter's password"})
    assert reply.status == 403 and "CORRAL_GROUPS" in reply.body.decode(), reply.body
    with corral.Client(cp.address, token=ops) as admin:
        assert [a.name for a in admin.accounts()] == ["eve"]
        admin.register("dave", PASSWORD)  # one who manages accounts makes it
    with corral.Client(cp.address) as anonymous:
        dave_login = anonymous.login("dave", PASSWORD).token
    with corral.Client(cp.address, token=dave_login) as dave:
        assert dave.get(job).owner == "alice"  # the group's jobs are the real dave's


def test_a_configured_token_s_name_is_not_for_an_account(make_control_plane: Any) -> None:
    # Named or not (an unnamed token's principal is token-<12 hex of its SHA-256>), an account under a
    # token's principal would own its jobs: refused like any taken name, whoever asks.
    alice, ops, unnamed = _token(), _token(), _token()
    hashed = f"token-{hashlib.sha256(unnamed.encode()).hexdigest()[:12]}"
    cp: ControlProc = make_control_plane(
        CORRAL_ACCOUNTS="open",
        CORRAL_AUTH_TOKENS=f"alice:{alice},ops:{ops},{unnamed}",
        CORRAL_WORKER_TOKEN=_token(),
        CORRAL_JOB_VISIBILITY="owner",
        CORRAL_AUTH_ADMINS="ops",
        CORRAL_PASSWORD_ROUNDS="10",
    )
    with corral.Client(cp.address, token=unnamed) as by_hash:
        assert by_hash.whoami().name == hashed
    for caller in (None, ops):
        with corral.Client(cp.address, token=caller) as client:
            for name in ("alice", hashed):
                with pytest.raises(AlreadyExists, match="configured client token"):
                    client.register(name, PASSWORD)
    with corral.Client(cp.address, token=ops) as admin:
        assert admin.accounts() == []


def test_anonymous_logins_under_malformed_names_are_refused_as_such_and_not_recorded(
    make_control_plane: Any,
) -> None:
    # A name that breaks the name rule costs no password hash, so its refusal must not land in the audit
    # log (where a caller without credentials could push every real event off the dashboard).
    ops = _token()
    cp = make_control_plane(
        CORRAL_ACCOUNTS="open",
        CORRAL_AUTH_TOKENS=f"ops:{ops}",
        CORRAL_WORKER_TOKEN=_token(),
        CORRAL_JOB_VISIBILITY="owner",
        CORRAL_AUTH_ADMINS="ops",
        CORRAL_PASSWORD_ROUNDS="10",
    )
    rest = Rest(cp.http_port)
    with corral.Client(cp.address) as anonymous:
        for n in range(100):
            with pytest.raises(InvalidArgument) as caught:
                anonymous.login(f"bad name {n} " + "x" * 300, "whatever1")
            assert caught.value.field == "name"
        for name in ("", "x" * 65, "ålice"):
            with pytest.raises(InvalidArgument) as caught:
                anonymous.login(name, "whatever1")
            assert caught.value.field == "name"
        reply = rest.post("/v1/login", {"name": "bad name", "password": "whatever1"})
        assert reply.status == 400 and "name" in reply.json()["message"], reply.body
        with pytest.raises(Unauthenticated, match="wrong name or password"):
            anonymous.login("nobody", "whatever1")  # well formed: hashed, refused alike, recorded
    with corral.Client(cp.address, token=ops) as admin:
        events = admin.audit(action="account.login").events
        assert [(e.actor, e.target, e.outcome) for e in events] == [("", "nobody", "UNAUTHENTICATED")]
        # A caller with credentials is recorded whatever the outcome: it is known, and accountable.
        with pytest.raises(InvalidArgument):
            admin.login("bad name", "whatever1")
        assert admin.audit(actor="ops", action="account.login").total == 1
