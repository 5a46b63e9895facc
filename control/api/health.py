"""grpc.health.v1 wiring: "" is liveness, "corral.v1.JobService" is readiness.

Readiness is SERVING only while at least one connected worker takes work, the store can be
written, and the control plane is not shutting down.
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

READINESS = "corral.v1.JobService"


SHUTTING_DOWN = "the control plane is shutting down: watch again once it is back"


class _ClosableHealthServicer(health.aio.HealthServicer):  # type: ignore[misc]  # grpc_health ships no types
    """grpc's health servicer, whose Watch streams end when the control plane stops.

    A client with client-side health checking keeps a Watch open for as long as it is connected, and a
    graceful stop waits for open calls: each one held the stop for the whole shutdown grace. On
    :meth:`close` every Watch is told NOT_SERVING and ends with UNAVAILABLE, and new ones are refused
    the same way; Check keeps answering until the server stops.

    Watch is its own loop rather than grpc's, which it would have to cancel on close: a write cut
    short by that cancel, sent but not yet acknowledged, left the stream unable to take another, and
    a stop right after a Watch began then waited out the whole grace.
    """

    def __init__(self) -> None:
        super().__init__()
        self._statuses: dict[str, health_pb2.HealthCheckResponse.ServingStatus] = {
            "": health_pb2.HealthCheckResponse.SERVING
        }
        self._closed = False
        self._changed = asyncio.Event()
        """Set (and replaced) at every change of a status, and on close."""

    async def set(self, service: str, status: health_pb2.HealthCheckResponse.ServingStatus) -> None:
        await super().set(service, status)
        self._statuses[service] = status
        self._wake()

    def close(self) -> None:
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext) -> None:
        last = None
        while not self._closed:
            status = self._statuses.get(request.service, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
            if status == last:
                await self._changed.wait()  # no await since the status was read: no change is missed
                continue
            await context.write(health_pb2.HealthCheckResponse(status=status))
            last = status
        if last is not None:
            await context.write(health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.NOT_SERVING))
        await context.abort(grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)


class Health:
    """The health service and the readiness rule."""

    SERVICE_NAME = health.SERVICE_NAME

    def __init__(self) -> None:
        self.servicer = _ClosableHealthServicer()
        self.ready = False
        self.shutting_down = False
        self._tasks: set[asyncio.Task[None]] = set()

    def add_to(self, server: grpc.aio.Server) -> None:
        """Serve grpc.health.v1.Health on ``server``."""
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    async def start(self) -> None:
        """Set liveness (``""``) SERVING, and readiness NOT_SERVING until :meth:`update` says otherwise."""
        await self.servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.servicer.set(READINESS, health_pb2.HealthCheckResponse.NOT_SERVING)

    def update(self, ready: bool) -> None:
        """Set readiness (ignored once shutting down)."""
        ready = ready and not self.shutting_down
        if ready == self.ready:
            return
        self.ready = ready
        task = asyncio.ensure_future(self._push())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _push(self) -> None:
        """Give the health service readiness as it is when this runs, not as it was when it was asked
        for: a push to SERVING still on its way when :meth:`shutdown` began would otherwise land after
        the shutdown's NOT_SERVING and stay for the whole shutdown."""
        ready = self.ready and not self.shutting_down
        status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        await self.servicer.set(READINESS, status)

    async def shutdown(self) -> None:
        """Readiness goes NOT_SERVING for good and open Watch streams end (NOT_SERVING, then UNAVAILABLE);
        liveness Check answers SERVING until the server stops."""
        self.shutting_down = True
        self.ready = False
        await self.servicer.set(READINESS, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.servicer.close()
