"""AdminServicer: the worker registry, draining, and the autoscaler's state.

With CORRAL_JOB_VISIBILITY=owner only the admins (CORRAL_AUTH_ADMINS) may call it (control.access)."""

from __future__ import annotations

import grpc

from control.api import convert
from control.api.identity import PRINCIPAL
from control.api.status import grpc_errors
from control.autoscale import Autoscaler
from control.sessions import WorkerSessions
from corral.v1 import admin_pb2


class AdminServicer:
    """corral.v1.AdminService."""

    def __init__(
        self, sessions: WorkerSessions, drain_deadline_sec: float = 30.0, autoscaler: Autoscaler | None = None
    ) -> None:
        self.sessions = sessions
        self.drain_deadline_sec = drain_deadline_sec
        self.autoscaler = autoscaler

    @grpc_errors
    async def ListWorkers(
        self, request: admin_pb2.ListWorkersRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListWorkersResponse:
        self.sessions.s.access.check_admin(PRINCIPAL.get())
        workers = self.sessions.s.registry.all()
        return admin_pb2.ListWorkersResponse(workers=[convert.worker(w) for w in workers])

    @grpc_errors
    async def DrainWorker(
        self, request: admin_pb2.DrainWorkerRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.Worker:
        self.sessions.s.access.check_admin(PRINCIPAL.get())
        return convert.worker(self.sessions.drain(convert.target_id(request.id), self.drain_deadline_sec))

    @grpc_errors
    async def GetAutoscaler(
        self, request: admin_pb2.GetAutoscalerRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.AutoscalerStatus:
        self.sessions.s.access.check_admin(PRINCIPAL.get())
        if self.autoscaler is not None:
            return convert.autoscaler(self.autoscaler.status())
        connected = len(self.sessions.s.registry.connected())
        return admin_pb2.AutoscalerStatus(mode="off", current_workers=connected, desired_workers=connected)
