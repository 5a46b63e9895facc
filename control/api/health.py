"""grpc.health.v1 wiring: "" is liveness, "corral.v1.JobService" is readiness.

Readiness is SERVING only while at least one connected worker takes work, the store can be
written, and the control plane is not shutting down.
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

READINESS = "corral.v1.JobService"


class Health:
    """The health service and the readiness rule."""

    SERVICE_NAME = health.SERVICE_NAME

    def __init__(self) -> None:
        self.servicer = health.aio.HealthServicer()
        self.ready = False
        self.shutting_down = False
        self._tasks: set[asyncio.Task[None]] = set()

    def add_to(self, server: grpc.aio.Server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    async def start(self) -> None:
        await self.servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.servicer.set(READINESS, health_pb2.HealthCheckResponse.NOT_SERVING)

    def update(self, ready: bool) -> None:
        """Set readiness (ignored once shutting down)."""
        ready = ready and not self.shutting_down
        if ready == self.ready:
            return
        self.ready = ready
        status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        task = asyncio.ensure_future(self.servicer.set(READINESS, status))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def shutdown(self) -> None:
        """Readiness goes NOT_SERVING for good; liveness stays until the server stops."""
        self.shutting_down = True
        self.ready = False
        await self.servicer.set(READINESS, health_pb2.HealthCheckResponse.NOT_SERVING)
