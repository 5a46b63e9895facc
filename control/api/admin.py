"""AdminServicer: the worker registry, draining, the autoscaler's state, the audit log and the shares.

With CORRAL_JOB_VISIBILITY=owner only the admins (CORRAL_AUTH_ADMINS) may call it (control.access)."""

from __future__ import annotations

import grpc

from control.admission.validation import check_text
from control.api import convert
from control.api.audited import audited
from control.api.status import grpc_errors
from control.audit import MAX_TARGET, OUTCOMES, AuditLog
from control.autoscale import Autoscaler
from control.identity import PRINCIPAL
from control.sessions import WorkerSessions
from corral.audit import ACTIONS
from corral.errors import InvalidArgument
from corral.v1 import admin_pb2

MAX_AUDIT_PAGE = 1000


class AdminServicer:
    """corral.v1.AdminService."""

    def __init__(
        self,
        sessions: WorkerSessions,
        drain_deadline_sec: float = 30.0,
        autoscaler: Autoscaler | None = None,
        audit: AuditLog | None = None,
    ) -> None:
        self.sessions = sessions
        self.drain_deadline_sec = drain_deadline_sec
        self.autoscaler = autoscaler
        self.audit = audit
        """The audit log: drains are recorded there, and ListAuditEvents reads it (None: off)."""

    @grpc_errors
    async def ListWorkers(
        self, request: admin_pb2.ListWorkersRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListWorkersResponse:
        """Every registered worker, connected or not. Like every call here, PERMISSION_DENIED to a caller that is not an
        admin while clients are kept apart (control.access)."""
        self.sessions.s.access.check_admin(PRINCIPAL.get())
        workers = self.sessions.s.registry.all()
        return admin_pb2.ListWorkersResponse(workers=[convert.worker(w) for w in workers])

    @grpc_errors
    @audited("worker.drain", lambda request: request.id)
    async def DrainWorker(
        self, request: admin_pb2.DrainWorkerRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.Worker:
        """Stop giving the worker jobs and, if it is connected, send it a Drain with the configured deadline; answers it
        as it is now. NOT_FOUND for an unknown id; audited as ``worker.drain``."""
        self.sessions.s.access.check_admin(PRINCIPAL.get())
        return convert.worker(self.sessions.drain(convert.target_id(request.id), self.drain_deadline_sec))

    @grpc_errors
    async def GetAutoscaler(
        self, request: admin_pb2.GetAutoscalerRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.AutoscalerStatus:
        """The autoscaler's state; without one, mode ``off`` with the connected workers as both current and desired."""
        self.sessions.s.access.check_admin(PRINCIPAL.get())
        if self.autoscaler is not None:
            return convert.autoscaler(self.autoscaler.status())
        connected = len(self.sessions.s.registry.connected())
        return admin_pb2.AutoscalerStatus(mode="off", current_workers=connected, desired_workers=connected)

    @grpc_errors
    async def ListAuditEvents(
        self, request: admin_pb2.ListAuditEventsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListAuditEventsResponse:
        """A page of the audit log, newest first, with the total that match: exact ``actor``, ``action``, ``target`` and
        ``outcome`` filters (an action of corral.audit.ACTIONS; OK or a status code name), ``limit`` 1..1000 (0: 100).
        An empty page when the log is off."""
        self.sessions.s.access.check_admin(PRINCIPAL.get())
        limit = request.limit or 100
        if not 1 <= limit <= MAX_AUDIT_PAGE:
            raise InvalidArgument("limit", f"must be between 1 and {MAX_AUDIT_PAGE}, got {limit}")
        if request.offset < 0:
            raise InvalidArgument("offset", f"must be >= 0, got {request.offset}")
        match = {"actor": request.actor, "action": request.action, "target": request.target, "outcome": request.outcome}
        for field, value in match.items():
            check_text(field, value, MAX_TARGET)
        if request.action and request.action not in ACTIONS:
            raise InvalidArgument("action", f"must be one of {', '.join(ACTIONS)}, got {request.action[:80]!r}")
        if request.outcome and request.outcome not in OUTCOMES:  # "ok", "maybe": no event has it, so no filter matches
            raise InvalidArgument(
                "outcome",
                f"must be OK or a status code name (NOT_FOUND, PERMISSION_DENIED, ...), got {request.outcome[:80]!r}",
            )
        if self.audit is None:
            return admin_pb2.ListAuditEventsResponse()
        page = await self.audit.page(match, limit, request.offset)
        return admin_pb2.ListAuditEventsResponse(events=[convert.audit_event(e) for e in page.events], total=page.total)

    @grpc_errors
    async def ListShares(
        self, request: admin_pb2.ListSharesRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListSharesResponse:
        """Each share's holdings, queue, rank and usage, lowest rank first, with the fair-share settings and the
        connected capacity the shares are parts of."""
        s = self.sessions.s
        s.access.check_admin(PRINCIPAL.get())
        rows, capacity = await s.share_rows()
        return admin_pb2.ListSharesResponse(
            shares=[convert.share(row) for row in rows],
            fair_share=s.shares.fair,
            half_life_sec=s.shares.half_life_sec,
            connected_threads=capacity.threads,
            connected_gpus=capacity.gpus,
            connected_memory_mb=capacity.memory_mb,
        )
