"""Readiness stays NOT_SERVING once a shutdown has begun, over a real gRPC server on 127.0.0.1.

A change of readiness reaches the gRPC health service through a task; one still on its way when the
shutdown began (a worker registered in the same loop turn as the SIGTERM was handled) used to land
after the shutdown's NOT_SERVING, and the readiness Check answered SERVING for the whole shutdown
grace, so that a load balancer kept sending calls to a control plane that was going away."""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from control.api.health import READINESS, Health

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _readiness(health: Health) -> tuple[int, int]:
    """Readiness as a gRPC client reads it (Check) once every pending push has run, and after a
    shutdown that began while a push to SERVING was still on its way."""
    server = grpc.aio.server()
    health.add_to(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            request = health_pb2.HealthCheckRequest(service=READINESS)
            await health.start()
            health.update(True)  # the push to SERVING is a task, not run yet
            await health.shutdown()  # in the same loop turn
            await asyncio.gather(*health._tasks)  # every push has run
            during = (await stub.Check(request, timeout=10)).status
            health.update(True)  # a worker that registers during the shutdown changes nothing
            await asyncio.gather(*health._tasks)
            after = (await stub.Check(request, timeout=10)).status
            return during, after
    finally:
        await server.stop(None)


def test_a_push_under_way_when_the_shutdown_begins_does_not_make_it_ready_again() -> None:
    assert asyncio.run(_readiness(Health())) == (NOT_SERVING, NOT_SERVING)
