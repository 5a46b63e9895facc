"""Accounts as the client sees them: :class:`Account`, a :class:`Login` and the caller's :class:`Identity`,
each a frozen value built from its ``corral.v1`` message by ``from_proto``.

An account is a person who logs in with a name and a password (``corral.v1.AccountService``) instead of
holding a configured token; a login's token is then sent like any client token, until it expires.
:func:`account_request` builds the service's requests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from google.protobuf.message import Message

from corral.errors import InvalidArgument
from corral.job import timestamp_to_datetime
from corral.spec import put
from corral.v1 import accounts_pb2

__all__ = ["Account", "Identity", "Login", "account_request"]

M = TypeVar("M", bound=Message)


@dataclass(frozen=True, slots=True)
class Account:
    """One account (``Register``, ``ListAccounts``, ``SetPassword``, and within a login or an identity)."""

    name: str
    """The owner of the jobs it submits."""
    group: str = ""
    """Its group in CORRAL_GROUPS ("" for none)."""
    admin: bool = False
    """Named in CORRAL_AUTH_ADMINS."""
    created_at: datetime | None = None
    password_changed_at: datetime | None = None
    """A change of the password ends every login made before it."""

    @classmethod
    def from_proto(cls, pb: accounts_pb2.Account) -> Account:
        """Build :class:`Account` from a ``corral.v1.Account`` message."""
        return cls(
            name=pb.name,
            group=pb.group,
            admin=pb.admin,
            created_at=timestamp_to_datetime(pb.created_at) if pb.HasField("created_at") else None,
            password_changed_at=(
                timestamp_to_datetime(pb.password_changed_at) if pb.HasField("password_changed_at") else None
            ),
        )

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict: datetimes in ISO 8601."""
        out = dataclasses.asdict(self)
        for key in ("created_at", "password_changed_at"):
            value = getattr(self, key)
            out[key] = value.isoformat() if value else None
        return out


@dataclass(frozen=True, slots=True)
class Login:
    """A login (``Login``): a token to send as the client token (``token=``, ``CORRAL_TOKEN``) until it expires."""

    token: str = field(repr=False)  # a bearer credential: kept out of logs and tracebacks that show the value
    """Sent as ``authorization: Bearer <token>``."""
    expires_at: datetime
    account: Account

    @classmethod
    def from_proto(cls, pb: accounts_pb2.LoginResponse) -> Login:
        """Build :class:`Login` from a ``corral.v1.LoginResponse`` message."""
        return cls(
            token=pb.token,
            expires_at=timestamp_to_datetime(pb.expire_time),
            account=Account.from_proto(pb.account),
        )


@dataclass(frozen=True, slots=True)
class Identity:
    """Who the control plane takes the caller for (``WhoAmI``)."""

    name: str
    """The caller's principal: an account's or a configured token's name ("" when auth is off)."""
    admin: bool = False
    account: Account | None = None
    """Set when the caller logged in to an account (``None`` for a configured token)."""
    expires_at: datetime | None = None
    """When the caller's login expires (``None`` for a configured token)."""

    @classmethod
    def from_proto(cls, pb: accounts_pb2.WhoAmIResponse) -> Identity:
        """Build :class:`Identity` from a ``corral.v1.WhoAmIResponse`` message."""
        return cls(
            name=pb.name,
            admin=pb.admin,
            account=Account.from_proto(pb.account) if pb.HasField("account") else None,
            expires_at=timestamp_to_datetime(pb.expire_time) if pb.HasField("expire_time") else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict: the account as :meth:`Account.to_dict`, datetimes in ISO 8601."""
        return {
            "name": self.name,
            "admin": self.admin,
            "account": self.account.to_dict() if self.account else None,
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
        }


def account_request(request_type: Callable[[], M], **fields: str) -> M:
    """A request of ``corral.v1.AccountService`` with these string fields.

    Raises:
        InvalidArgument: naming the field, for a value that is not a string (as :func:`corral.spec.by_id`
            does for an id); a password's value is left out of the message.
    """
    request = request_type()
    for name, value in fields.items():
        if "password" in name and not isinstance(value, str):
            # put() would quote the value in its message, and a message ends up on screens and in logs
            raise InvalidArgument(name, f"must be a string, got a {type(value).__name__}")
        put(request, name, value)
    return request
