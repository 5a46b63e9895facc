"""The one decorator that puts a servicer method's calls in the audit log (control.audit)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from control.audit import AuditLog
from corral.audit import ACTIONS
from corral.errors import CorralError

__all__ = ["audited"]

F = TypeVar("F", bound=Callable[..., Any])


def audited(action: str, target: Callable[[Any], str]) -> Callable[[F], F]:
    """Record each call of the decorated method as ``action`` on ``target(request)``, with its outcome:
    OK, or the code of the error it raised. Goes under :func:`control.api.status.grpc_errors`, which
    turns that error into the status afterwards. The servicer's ``audit`` (None: nothing recorded)."""
    if action not in ACTIONS:
        raise ValueError(f"{action!r} is not an audit action: add it to corral.audit.ACTIONS")

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        async def call(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            log: AuditLog | None = getattr(self, "audit", None)
            if log is None:
                return await fn(self, request, context)
            try:
                result = await fn(self, request, context)
            except CorralError as exc:
                await log.record(action, target(request), exc.code)
                raise
            except Exception:
                await log.record(action, target(request), "INTERNAL")
                raise
            await log.record(action, target(request), "OK")
            return result

        return call  # type: ignore[return-value]

    return wrap
