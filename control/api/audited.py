"""The one decorator that puts a servicer method's calls in the audit log (control.audit)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Collection
from typing import Any, TypeVar

import grpc

from control.api.identity import PRINCIPAL
from control.audit import AuditLog
from corral.audit import ACTIONS
from corral.errors import CorralError

__all__ = ["audited"]

F = TypeVar("F", bound=Callable[..., Any])


def audited(action: str, target: Callable[[Any], str], anonymous: Collection[str] | None = None) -> Callable[[F], F]:
    """Record each call of the decorated method as ``action`` on ``target(request)``, with its outcome:
    OK, or the code of the error it raised. Goes under :func:`control.api.status.grpc_errors`, which
    turns that error into the status afterwards. The servicer's ``audit`` (None: nothing recorded).

    ``anonymous``: the only outcomes recorded for a call without a principal (None: all). Login and
    Register need no credentials, so a caller could otherwise fill the log with refusals that cost it
    nothing; the outcomes kept are those that took a password hash, which bounds their rate."""
    if action not in ACTIONS:
        raise ValueError(f"{action!r} is not an audit action: add it to corral.audit.ACTIONS")

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        async def call(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            log: AuditLog | None = getattr(self, "audit", None)
            if log is None:
                return await fn(self, request, context)
            outcome = "OK"
            try:
                return await fn(self, request, context)
            except CorralError as exc:
                outcome = exc.code
                raise
            except asyncio.CancelledError:  # the caller went away: what was done is unknown
                outcome = "CANCELLED"
                raise
            except Exception:
                outcome = "INTERNAL"
                raise
            finally:
                if anonymous is None or outcome in anonymous or PRINCIPAL.get():
                    await log.record(action, target(request), outcome)

        return call  # type: ignore[return-value]

    return wrap
