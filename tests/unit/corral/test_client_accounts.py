"""Accounts on the client: Account, Login and Identity from their messages. Both clients against a real
control plane: tests/integration/test_accounts.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from google.protobuf import timestamp_pb2

from corral import Account, Identity, InvalidArgument, Login
from corral.account import account_request
from corral.v1 import accounts_pb2

CREATED = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
CHANGED = datetime(2026, 2, 3, 4, 5, 6, tzinfo=UTC)
EXPIRES = datetime(2026, 11, 27, 11, 2, 3, tzinfo=UTC)


def ts(value: datetime) -> timestamp_pb2.Timestamp:
    out = timestamp_pb2.Timestamp()
    out.FromDatetime(value)
    return out


ALICE = accounts_pb2.Account(
    name="alice", group="ml", admin=True, created_at=ts(CREATED), password_changed_at=ts(CHANGED)
)


def test_account_from_proto_converts_every_field_exactly() -> None:
    account = Account.from_proto(ALICE)
    assert account == Account("alice", "ml", True, CREATED, CHANGED)
    assert account.created_at is not None and account.created_at.microsecond == 678901
    assert account.to_dict() == {
        "name": "alice",
        "group": "ml",
        "admin": True,
        "created_at": "2026-01-02T03:04:05.678901+00:00",
        "password_changed_at": "2026-02-03T04:05:06+00:00",
    }


def test_account_from_proto_leaves_unset_times_none() -> None:
    account = Account.from_proto(accounts_pb2.Account(name="bob"))
    assert account == Account("bob", "", False, None, None)
    assert json.loads(json.dumps(account.to_dict()))["created_at"] is None


def test_login_from_proto_and_its_repr_keeps_the_token_out() -> None:
    pb = accounts_pb2.LoginResponse(token="s3cret-token-value", expire_time=ts(EXPIRES), account=ALICE)
    login = Login.from_proto(pb)
    assert (login.token, login.expires_at, login.account.name) == ("s3cret-token-value", EXPIRES, "alice")
    assert "s3cret" not in repr(login) and "alice" in repr(login)


def test_identity_from_proto_for_a_login_a_configured_token_and_no_auth() -> None:
    logged_in = Identity.from_proto(
        accounts_pb2.WhoAmIResponse(name="alice", account=ALICE, admin=True, expire_time=ts(EXPIRES))
    )
    assert logged_in == Identity("alice", True, Account.from_proto(ALICE), EXPIRES)
    assert logged_in.to_dict()["account"]["group"] == "ml"
    assert logged_in.to_dict()["expires_at"] == "2026-11-27T11:02:03+00:00"
    configured = Identity.from_proto(accounts_pb2.WhoAmIResponse(name="ci"))
    assert configured == Identity("ci", False, None, None)
    assert configured.to_dict() == {"name": "ci", "admin": False, "account": None, "expires_at": None}


def test_the_values_are_frozen_and_slotted() -> None:
    account = Account("bob")
    with pytest.raises(AttributeError):
        account.name = "eve"  # type: ignore[misc]
    assert not hasattr(account, "__dict__")


def test_a_password_that_is_not_a_string_is_refused_without_showing_it() -> None:
    with pytest.raises(InvalidArgument) as info:
        account_request(accounts_pb2.LoginRequest, name="alice", password=b"hunter22")  # type: ignore[arg-type]
    assert info.value.field == "password" and "hunter22" not in str(info.value)
    with pytest.raises(InvalidArgument) as info:
        account_request(accounts_pb2.DeleteAccountRequest, name=7)  # type: ignore[arg-type]
    assert info.value.field == "name"
