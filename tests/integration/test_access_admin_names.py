"""Open registration (CORRAL_ACCOUNTS=open) on a real control plane on 127.0.0.1: a name in
CORRAL_AUTH_ADMINS is an admin's, so registering it is for those who manage accounts, not for whoever
comes first (who would then see every job and reset everyone's password)."""

from __future__ import annotations

import secrets
from typing import Any

import pytest

import corral
from corral.errors import PermissionDenied
from tests.conftest import ControlProc
from tests.integration.test_rest import Rest

PASSWORD = "correct horse"


def _open_site(make_control_plane: Any) -> tuple[ControlProc, str]:
    ops = secrets.token_urlsafe(24)
    cp = make_control_plane(
        CORRAL_ACCOUNTS="open",
        CORRAL_AUTH_TOKENS=f"ops:{ops}",
        CORRAL_WORKER_TOKEN=secrets.token_urlsafe(24),
        CORRAL_JOB_VISIBILITY="owner",
        CORRAL_AUTH_ADMINS="ops,root",
        CORRAL_PASSWORD_ROUNDS="10",
    )
    return cp, ops


def test_an_admin_s_name_is_not_for_anyone_to_register(make_control_plane: Any) -> None:
    cp, ops = _open_site(make_control_plane)
    with corral.Client(cp.address) as anonymous:
        anonymous.register("alice", PASSWORD)  # any other name: open registration as before
        with pytest.raises(PermissionDenied, match="CORRAL_AUTH_ADMINS"):
            anonymous.register("root", "squatter's password")
        alice_login = anonymous.login("alice", PASSWORD).token
    with corral.Client(cp.address, token=alice_login) as alice, pytest.raises(PermissionDenied):
        alice.register("root", "squatter's password")  # a logged-in account does not manage accounts
    # The same refusal over REST, and nothing was made by any of them
    reply = Rest(cp.http_port).post("/v1/accounts", {"name": "root", "password": "squatter's password"})
    assert reply.status == 403, reply.body
    with corral.Client(cp.address, token=ops) as admin:
        assert [a.name for a in admin.accounts()] == ["alice"]
        # One who manages accounts makes it, and its login is an admin's
        admin.register("root", PASSWORD)
    with corral.Client(cp.address) as anonymous:
        root_login = anonymous.login("root", PASSWORD).token
    with corral.Client(cp.address, token=root_login) as root:
        assert root.whoami().admin


def test_a_deleted_admin_s_name_is_not_for_anyone_to_take_over(make_control_plane: Any) -> None:
    cp, ops = _open_site(make_control_plane)
    with corral.Client(cp.address, token=ops) as admin:
        admin.register("root", PASSWORD)
        admin.delete_account("root")  # the admin left; CORRAL_AUTH_ADMINS still names root
    with corral.Client(cp.address) as anonymous, pytest.raises(PermissionDenied, match="CORRAL_AUTH_ADMINS"):
        anonymous.register("root", "squatter's password")
    with corral.Client(cp.address, token=ops) as admin:
        assert admin.accounts() == []
