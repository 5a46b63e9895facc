"""A name that still owns jobs, on a real control plane and a real worker on 127.0.0.1.

An account's or a token's name owns its jobs, and they stay when the account is deleted or the token
is removed from the token file. Until retention has purged them, open registration may not take the
name (it would get those jobs, their payloads and idempotency keys); one who manages accounts may
create it, handing the jobs over on purpose.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

import corral
from corral.errors import AlreadyExists, Unauthenticated
from tests.conftest import wait_until
from tests.integration.test_accounts import PASSWORD, Site, _login, _site, _token
from tests.integration.test_auth import both_accept, grpc_accepts, replace_file


@pytest.fixture
def open_site(make_control_plane: Any, spawn_worker: Any) -> Site:
    return _site(make_control_plane, spawn_worker, "open")


def test_a_deleted_account_s_name_goes_to_nobody_else_but_an_admin_may_hand_it_over(open_site: Site) -> None:
    cp, key = open_site.cp, f"key-{uuid.uuid4()}"
    # Given alice's job (with an idempotency key), and her account deleted
    with corral.Client(cp.address) as anonymous:
        anonymous.register("alice", PASSWORD)
    with _login(cp, "alice") as alice:
        job = alice.submit("noop", {"text": "alice's secret"}, idempotency_key=key)
        alice.wait(job.id, timeout=30)
        alice.delete_account("alice")
    # When anyone registers the name, Then it is refused, and they get no login to see her jobs with
    with corral.Client(cp.address) as anonymous:
        with pytest.raises(
            AlreadyExists, match=r"still owns jobs of a former account or token.*an admin may create it"
        ):
            anonymous.register("alice", "mallory's password")
        with pytest.raises(Unauthenticated):
            anonymous.login("alice", "mallory's password")
    # When an admin creates it, Then the new account has the jobs (and the key), and the hand-over is logged
    with corral.Client(cp.address, token=open_site.ops) as ops:
        ops.register("alice", "handed over")
    with _login(cp, "alice", "handed over") as heir:
        listed = heir.list()
        assert [(j.id, j.payload) for j in listed.jobs] == [(job.id, {"text": "alice's secret"})]
        assert heir.submit("noop", {"text": "alice's secret"}, idempotency_key=key).id == job.id
    (warned,) = [e for e in cp.events("account_registered") if e["level"] == "warning"]
    assert warned["account"] == "alice" and warned["former_jobs"] is True


def test_a_token_name_removed_from_the_token_file_goes_to_no_registration_while_it_owns_jobs(
    make_control_plane: Any, spawn_worker: Any, tmp_path: Path
) -> None:
    carol, dave = _token(), _token()
    token_file = tmp_path / "tokens"
    token_file.write_text(f"carol:{carol}\n")
    site = _site(make_control_plane, spawn_worker, "open", CORRAL_AUTH_TOKEN_FILE=str(token_file))
    cp = site.cp
    # Given carol's job, and her token removed from the file
    with corral.Client(cp.address, token=carol) as as_carol:
        job = as_carol.wait(as_carol.submit("noop", {"text": "carol's secret"}).id, timeout=30)
    replace_file(token_file, f"dave:{dave}\n")
    wait_until(lambda: both_accept(cp, dave), timeout=15, what="the token file to be re-read")
    assert not grpc_accepts(cp, carol)
    # When anyone registers her name, Then it is refused
    with corral.Client(cp.address) as anonymous, pytest.raises(AlreadyExists, match="still owns jobs of a former"):
        anonymous.register("carol", PASSWORD)
    with corral.Client(cp.address, token=site.ops) as ops:
        assert ops.accounts() == [] and ops.get(job.id).owner == "carol"
