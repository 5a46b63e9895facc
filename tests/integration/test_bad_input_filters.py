"""Bad filters and names found by a sweep, against a real control plane: the audit log's ``outcome``, a job
state the clients cannot name, labels that are not a mapping, and an account name that breaks the name
rule. Each is a clear refusal that names the field and the rule (INVALID_ARGUMENT; 400 over REST), and
changes nothing.

The cases share one control plane with accounts and client tokens (``site``), and each leaves it as it
found it.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from corral import AsyncClient, Client
from corral.errors import InvalidArgument, NotFound
from tests.conftest import FAST_ENV, ControlProc
from tests.integration.test_rest import Rest
from tests.support import cli

INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT.value[0]
PASSWORD = "correct horse"
LONG_NAME = "x" * 10_000


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlProc]:
    """A control plane with accounts (registered by admins) and one admin's client token, ``ops``; no worker,
    so a job stays PENDING."""
    token = secrets.token_urlsafe(24)
    env = {
        **FAST_ENV,
        "CORRAL_ACCOUNTS": "admin",
        "CORRAL_AUTH_TOKENS": f"ops:{token}",
        "CORRAL_WORKER_TOKEN": secrets.token_urlsafe(24),
        "CORRAL_JOB_VISIBILITY": "owner",
        "CORRAL_AUTH_ADMINS": "ops",
        "CORRAL_PASSWORD_ROUNDS": "10",
    }
    cp = ControlProc(tmp_path_factory.mktemp("filters-control"), env, token=token)
    try:
        cp.start()
        yield cp
    finally:
        cp.close()


def _ops(cp: ControlProc) -> Client:
    return Client(cp.address, token=cp.token)


def _bearer(cp: ControlProc) -> dict[str, str]:
    return {"Authorization": f"Bearer {cp.token}"}


# ---- the audit log's outcome filter ----------------------------------------------------------------
@pytest.mark.parametrize("outcome", ["maybe", "ok", "not_found", "Ok", "SUCCEEDED", " OK"])
def test_an_audit_outcome_that_no_event_can_have_is_refused_naming_the_field(site: ControlProc, outcome: str) -> None:
    # "maybe", or "ok" for OK, answered an empty page: as if nothing had happened, while `action` was checked
    with _ops(site) as ops:
        with pytest.raises(NotFound):
            ops.delete_account(f"nobody-{outcome.strip().lower()}")  # an event to be found (or not)
        with pytest.raises(InvalidArgument) as caught:
            ops.audit(outcome=outcome)
    assert caught.value.field == "outcome", caught.value
    assert "status code name" in caught.value.rule and repr(outcome) in caught.value.rule, caught.value

    async def via_async() -> InvalidArgument:
        async with AsyncClient(site.address, token=site.token) as ops:
            with pytest.raises(InvalidArgument) as err:
                await ops.audit(outcome=outcome)
            return err.value

    assert asyncio.run(via_async()).field == "outcome"
    reply = Rest(site.http_port).get(f"/v1/audit?outcome={outcome.replace(' ', '%20')}", headers=_bearer(site))
    assert reply.status == 400, reply.body
    assert reply.json()["code"] == INVALID_ARGUMENT and reply.violation() == "outcome", reply.body
    env = {"CORRAL_CONTROL_ADDR": site.address, "CORRAL_TOKEN": site.token}
    done = cli.corral("audit", "--outcome", outcome, env=env)
    assert done.returncode != 0 and "outcome" in done.stderr and "status code name" in done.stderr, done


def test_an_audit_outcome_that_events_have_is_taken(site: ControlProc) -> None:
    with _ops(site) as ops:
        with pytest.raises(NotFound):
            ops.delete_account("nobody-taken")
        refused = ops.audit(outcome="NOT_FOUND", target="nobody-taken")
        assert [(e.action, e.outcome) for e in refused.events] == [("account.delete", "NOT_FOUND")]
        for outcome in ("", "OK", "PERMISSION_DENIED", "CANCELLED", "DATA_LOSS"):  # no filter, or one
            ops.audit(outcome=outcome, target="nobody-taken")
        assert ops.audit(outcome="OK", target="nobody-taken").total == 0
        assert ops.audit(target="nobody-taken").total == 1
    reply = Rest(site.http_port).get("/v1/audit?outcome=NOT_FOUND&target=nobody-taken", headers=_bearer(site))
    assert reply.status == 200 and reply.json()["total"] == "1", reply.body


# ---- a state the clients cannot name ---------------------------------------------------------------
@pytest.mark.parametrize("status", [[99], [-1], 99, [None], None, [2.5], [True], ["done"], [2**70]])
def test_a_status_that_is_no_state_is_invalid_argument_and_cancels_nothing(site: ControlProc, status: Any) -> None:
    # [99] was "ValueError: 99 is not a valid JobState", None or 2.5 an AttributeError from .strip()
    label = {"case": secrets.token_hex(4)}
    with _ops(site) as ops:
        job = ops.submit("noop", {}, labels=label)  # no worker: it stays PENDING
        errors = []
        for call in (
            lambda: ops.list(status=status),
            lambda: ops.cancel_many(status=status, labels=label),
        ):
            with pytest.raises(InvalidArgument) as caught:
                call()
            errors.append(caught.value)

        async def via_async() -> list[InvalidArgument]:
            out = []
            async with AsyncClient(site.address, token=site.token) as aops:
                with pytest.raises(InvalidArgument) as listed:
                    await aops.list(status=status)
                out.append(listed.value)
                with pytest.raises(InvalidArgument) as cancelled:
                    await aops.cancel_many(status=status, labels=label)
                out.append(cancelled.value)
            return out

        errors += asyncio.run(via_async())
        for err in errors:
            assert err.field == "status" and "SCHEDULED, PENDING, RUNNING" in err.rule, err
        assert ops.get(job.id).state.name == "PENDING"
        # a state given by any-case name is still taken
        assert [j.id for j in ops.list(status=["Pending"], labels=label).jobs] == [job.id]
        assert [j.id for j in ops.list(status=" pending", labels=label).jobs] == [job.id]
        assert ops.cancel_many(status=["PENDING"], labels=label).ids == [job.id]


# ---- labels that are not a mapping -----------------------------------------------------------------
@pytest.mark.parametrize("labels", [[("team", "edge")], "team=edge", ["team=edge"], 7])
def test_labels_of_a_filter_that_are_not_a_mapping_are_invalid_argument_and_change_nothing(
    site: ControlProc, labels: Any
) -> None:
    # list, cancel_many and retry_many raised AttributeError ("'list' object has no attribute 'items'")
    with _ops(site) as ops:
        job = ops.submit("noop", {}, labels={"case": secrets.token_hex(4)})
        errors = []
        for call in (
            lambda: ops.list(labels=labels),
            lambda: ops.cancel_many(labels=labels),
            lambda: ops.retry_many(labels=labels),
        ):
            with pytest.raises(InvalidArgument) as caught:
                call()
            errors.append(caught.value)

        async def via_async() -> list[InvalidArgument]:
            out = []
            async with AsyncClient(site.address, token=site.token) as aops:
                for name in ("list", "cancel_many", "retry_many"):
                    with pytest.raises(InvalidArgument) as caught:
                        await getattr(aops, name)(labels=labels)
                    out.append(caught.value)
            return out

        errors += asyncio.run(via_async())
        for err in errors:
            assert err.field == "labels" and "mapping of strings to strings" in err.rule, err
            assert type(labels).__name__ in err.rule, err
        assert ops.get(job.id).state.name == "PENDING"
        ops.cancel(job.id)


# ---- account names ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "rule"), [("", "is required"), (LONG_NAME, "1 to 64"), ("al ice", "1 to 64")])
def test_an_account_name_that_breaks_the_name_rule_is_refused_before_the_lookup(
    site: ControlProc, name: str, rule: str
) -> None:
    # DeleteAccount("") answered NOT_FOUND "account '' not found", and so did SetPassword and DeleteAccount of
    # a 10,000-character name: the rule Register enforces was not applied
    with _ops(site) as ops:
        ops.register("alice", PASSWORD)
        try:
            for call in (lambda: ops.delete_account(name), lambda: ops.set_password(name, PASSWORD + "!")):
                with pytest.raises(InvalidArgument) as caught:
                    call()
                assert caught.value.field == "name" and rule in caught.value.rule, caught.value
            with pytest.raises(InvalidArgument) as registered:  # the same rule as Register's
                ops.register(name, PASSWORD)
            assert registered.value.field == "name" and rule in registered.value.rule
            assert [a.name for a in ops.accounts()] == ["alice"]
            if name:  # REST: an empty name matches no route, and a path of 8 KiB is the HTTP server's to refuse
                rest = Rest(site.http_port)
                path = f"/v1/accounts/{name[:2000].replace(' ', '%20')}"
                for method, url, body in [
                    ("DELETE", path, None),
                    ("POST", f"{path}:setPassword", {"password": PASSWORD}),
                ]:
                    reply = rest.call(method, url, body, headers=_bearer(site))
                    assert reply.status == 400, (method, reply.status, reply.body[:300])
                    assert reply.json()["code"] == INVALID_ARGUMENT and reply.violation() == "name", reply.body[:300]
            assert [a.name for a in ops.accounts()] == ["alice"]
            ops.login("alice", PASSWORD)  # its password is unchanged
        finally:
            ops.delete_account("alice")
