"""The audit log as the client sees it (``Client.audit``, ``corral audit``): who cancelled, retried,
drained, registered, logged in, changed a password, deleted an account or ended every login, when, and
with what outcome."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from corral.job import timestamp_to_datetime
from corral.spec import put
from corral.v1 import admin_pb2

__all__ = ["ACTIONS", "AuditEvent", "AuditPage", "audit_request"]

ACTIONS = (
    "job.cancel",
    "job.retry",
    "worker.drain",
    "account.register",
    "account.login",
    "account.set_password",
    "account.delete",
    "account.end_all_logins",
)
"""Every action the audit log records (the control plane records these and no others)."""


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One event of the audit log."""

    seq: int
    """Increasing: a later event has a larger number."""
    time: datetime
    actor: str
    """Who: a token's or an account's name ("" without auth, and for a login)."""
    action: str
    """job.cancel, job.retry, worker.drain, account.register, account.login, account.set_password,
    account.delete, account.end_all_logins."""
    target: str
    """The job or worker id, or the account name."""
    outcome: str
    """OK, or the status the call was refused with (PERMISSION_DENIED, NOT_FOUND, ...)."""
    request_id: str
    """The call's X-Request-ID, which its log lines carry too."""

    @classmethod
    def from_proto(cls, pb: admin_pb2.AuditEvent) -> AuditEvent:
        """Build :class:`AuditEvent` from a ``corral.v1.AuditEvent`` message."""
        return cls(
            seq=pb.seq,
            time=timestamp_to_datetime(pb.time),
            actor=pb.actor,
            action=pb.action,
            target=pb.target,
            outcome=pb.outcome,
            request_id=pb.request_id,
        )

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict: the time in ISO 8601."""
        return {
            "seq": self.seq,
            "time": self.time.isoformat(),
            "actor": self.actor,
            "action": self.action,
            "target": self.target,
            "outcome": self.outcome,
            "request_id": self.request_id,
        }


@dataclass(frozen=True, slots=True)
class AuditPage:
    """One page of the audit log, newest first, and how many events match in total."""

    events: list[AuditEvent]
    total: int

    @classmethod
    def from_proto(cls, pb: admin_pb2.ListAuditEventsResponse) -> AuditPage:
        """Build :class:`AuditPage` from a ``corral.v1.ListAuditEventsResponse`` message."""
        return cls([AuditEvent.from_proto(e) for e in pb.events], pb.total)


def audit_request(
    actor: str, action: str, target: str, outcome: str, limit: int, offset: int
) -> admin_pb2.ListAuditEventsRequest:
    """A ``ListAuditEventsRequest``; a value of the wrong type is an InvalidArgument naming its field."""
    request = admin_pb2.ListAuditEventsRequest()
    for name, value in (
        ("actor", actor),
        ("action", action),
        ("target", target),
        ("outcome", outcome),
        ("limit", limit),
        ("offset", offset),
    ):
        put(request, name, value)
    return request
