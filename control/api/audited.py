"""The one decorator that puts a servicer method's calls in the audit log (control.audit)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeVar

import grpc

from control.audit import AuditLog
from control.identity import PRINCIPAL
from corral.audit import ACTIONS
from corral.errors import CorralError

__all__ = ["audited"]

F = TypeVar("F", bound=Callable[..., Any])


def audited(
    action: str,
    target: Callable[[Any], str],
    anonymous: Collection[str] | None = None,
    each: Callable[[Any], Sequence[str]] | None = None,
) -> Callable[[F], F]:
    """Record each call of the decorated method as ``action`` on ``target(request)``, with its outcome:
    OK, or the code of the error it raised. Goes under :func:`control.api.status.grpc_errors`, which
    turns that error into the status afterwards. The servicer's ``audit`` (None: nothing recorded).

    ``each``: for a call that acts on many targets, the targets its answer names; a call that succeeds
    is then recorded once per target (none: nothing was done, nothing is recorded), a refused one as
    ``target(request)``.

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
            answer = None
            try:
                answer = await fn(self, request, context)
                return answer
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
                if each is not None and outcome == "OK":
                    await log.record_each(action, each(answer), outcome)
                elif anonymous is None or outcome in anonymous or PRINCIPAL.get():
                    await log.record(action, target(request), outcome)

        return call  # type: ignore[return-value]

    return wrap
