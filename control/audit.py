"""The audit log: who changed what, when, and whether it was allowed, kept in the store and listed by
AdminService.ListAuditEvents (``corral audit``, ``GET /v1/audit``).

What is recorded: every call that cancels or retries a job (a CancelJobs or RetryJobs call: one
event per job it changed), drains a worker, registers an account, logs in, sets a password, deletes
an account or ends every login, allowed or refused (the actions are listed in ``corral.audit.ACTIONS``). Submissions are not: each job keeps its owner and request
id, and the log would grow with the jobs. Refusals are what an audit
is often read for (someone trying another's job, or guessing passwords), so a refused call is
recorded with the status it got, and a refused login with the name it tried.

An event is recorded once the call has finished, and committed before the call answers: the answer
a caller saw is in the log. A crash between a change's commit and its event's loses the event, not
the change. Events are kept ``CORRAL_AUDIT_RETENTION_SEC`` (90 days; 0: for ever), swept in steps
of :data:`PURGE_BATCH`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import grpc

from control.admission.idempotency import sweep_interval
from control.clock import Clock
from control.store import AuditEntry, AuditPage, Store
from control.turns import in_turns, pause
from corral import logs

__all__ = ["MAX_TARGET", "OUTCOMES", "PURGE_BATCH", "AuditLog"]

logger = logging.getLogger(__name__)

MAX_TARGET = 256
"""Longest target kept, in characters: a refused call may name anything a caller sent."""
PURGE_BATCH = 1000
OUTCOMES = frozenset(code.name for code in grpc.StatusCode)
"""Every outcome an event may have: OK, or the name of the status code the call was refused with (the
code of the :class:`~corral.errors.CorralError` it raised, CANCELLED when its caller went away,
INTERNAL for any other error; see control.api.audited)."""


class AuditLog:
    """Records events into ``store`` and sweeps them after ``retention_sec`` (0: never)."""

    def __init__(self, store: Store, clock: Clock, retention_sec: float) -> None:
        self.store = store
        self.clock = clock
        self.retention_sec = retention_sec

    async def record(self, action: str, target: str, outcome: str) -> None:
        """Record that the current call (its principal and request id) did ``action`` to ``target``
        with ``outcome`` (one of :data:`OUTCOMES`), and commit it."""
        await self.record_each(action, (target,), outcome)

    async def record_each(self, action: str, targets: Sequence[str], outcome: str) -> None:
        """:meth:`record` for each of ``targets`` (a call that acted on many: one event each, so that a
        target's history reads the same however it was reached), :data:`PURGE_BATCH` to a transaction
        with a loop turn between, so that ten thousand events do not hold up other calls."""
        actor = logs.current_principal.get() or ""
        request_id = (logs.current_request.get() or "")[:MAX_TARGET]
        now = self.clock.now()
        async for _, chunk in in_turns(targets, PURGE_BATCH):
            for target in chunk:
                self.store.put_audit(AuditEntry(now, actor, action, target[:MAX_TARGET], outcome, request_id))
            await self.store.commit()

    async def page(self, match: dict[str, str], limit: int, offset: int) -> AuditPage:
        """Newest first, the events whose fields equal ``match``'s values (actor, action, target, outcome)."""
        return await self.store.list_audit(match, limit, offset)

    async def sweep(self) -> int:
        """Delete every event past its retention now, :data:`PURGE_BATCH` at a time; returns how many."""
        total = 0
        while True:
            purged = await self.store.purge_audit(self.clock.now() - self.retention_sec, PURGE_BATCH)
            total += purged
            if purged < PURGE_BATCH:
                return total
            await pause()

    async def run(self) -> None:
        """Sweep until cancelled (returns at once when events are kept for ever)."""
        if self.retention_sec <= 0:
            return
        while True:
            try:
                await self.sweep()
            except Exception:  # a failed sweep must not stop later ones
                logger.exception("audit_purge_failed")
            await asyncio.sleep(sweep_interval(self.retention_sec))
