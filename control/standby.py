"""What a standby control plane serves while another one leads the shared store.

It answers on the ports it will serve once it leads, so that an orchestrator keeps it alive and
routes nothing to it:

* gRPC health: liveness (``""``) SERVING, readiness (``corral.v1.JobService``) NOT_SERVING;
* every other gRPC call: UNAVAILABLE, naming the control plane that leads (a worker that lists this
  address moves on to the next one; a client retries elsewhere);
* HTTP ``/healthz`` 200, ``/readyz`` 503 with the reason, ``/metrics``; every REST call 503 with the
  same ``google.rpc.Status`` as the gRPC answer.

When the store is free the control plane stops this and starts its real servers on the same ports.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf.message import Message

from control.api import Health, add_port, server_credentials
from control.api.status import rich_status
from control.gateway import Gateway, HttpLimits, http_routes
from control.gateway.rules import Route
from control.gateway.status import RpcFailure
from control.metrics import Metrics
from control.tls import ServerTls
from corral.errors import STANDBY_PREFIX, Unavailable
from corral.transport import host_port

__all__ = ["StandbyFront"]

logger = logging.getLogger(__name__)

_HEALTH_PREFIX = "/grpc.health.v1.Health/"


class _Refusing(grpc.GenericRpcHandler):  # type: ignore[misc]  # grpc ships no types
    """Every method but health: UNAVAILABLE with the standby's reason, whatever its shape (a streaming
    handler serves unary calls too: on the wire every call is a stream)."""

    def __init__(self, error: Unavailable) -> None:
        self._status = rich_status(error)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = str(getattr(handler_call_details, "method", ""))
        if method.startswith(_HEALTH_PREFIX):
            return None

        async def refuse(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]) -> None:
            code, message, trailers = self._status
            context.set_trailing_metadata(trailers)
            await context.abort(code, message)

        return grpc.stream_stream_rpc_method_handler(refuse)


class _RefusingInvoker:
    """The REST bridge's way to the services, while there are none: each call fails as gRPC's would."""

    def __init__(self, error: Unavailable) -> None:
        code, message, trailers = rich_status(error)
        self._failure = RpcFailure.from_trailers(code, message, trailers)

    async def unary(self, route: Route, request: Message, metadata: tuple[tuple[str, str], ...]) -> Message:
        raise self._failure

    async def stream(
        self, route: Route, request: Message | AsyncIterator[Message], metadata: tuple[tuple[str, str], ...]
    ) -> AsyncIterator[Message]:
        raise self._failure
        yield  # pragma: no cover (an async generator that fails at once)

    async def close(self) -> None:
        return None


class StandbyFront:
    """The standby's servers (see the module docstring); :meth:`start`, then :meth:`stop` before the
    real servers bind the same ports."""

    def __init__(
        self,
        *,
        host: str,
        grpc_port: int,
        http_port: int,
        worker_port: int | None,
        tls: ServerTls | None,
        services: list[Any],
        metrics: Metrics,
        leader: str,
        http_max_body_bytes: int,
        http_limits: HttpLimits | None = None,
    ) -> None:
        self.reason = (
            f"{STANDBY_PREFIX}another control plane leads the database ({leader}); this one takes over when it stops"
        )
        error = Unavailable(self.reason)
        self._host = host
        self._grpc_port = grpc_port
        self._http_port = http_port
        self._worker_port = worker_port
        self._tls = tls
        self._health = Health()
        self._server = grpc.aio.server(handlers=[_Refusing(error)], options=[("grpc.so_reuseport", 0)])
        self._health.add_to(self._server)
        self._gateway = Gateway(
            host,
            http_port,
            _RefusingInvoker(error),
            http_routes(services),
            lambda: self.reason,
            metrics,
            http_max_body_bytes,
            0.0,
            ssl_context=tls.ssl_context() if tls else None,
            limits=http_limits,
        )

    async def start(self) -> None:
        """Listen on the control plane's ports.

        Raises:
            OSError: a port cannot be bound (the message names the address).
        """
        credentials = server_credentials(self._tls) if self._tls else None
        add_port(self._server, host_port(self._host, self._grpc_port), credentials)
        if self._worker_port is not None and self._tls is not None:
            mutual = server_credentials(self._tls, require_client_cert=True)
            add_port(self._server, host_port(self._host, self._worker_port), mutual)
        await self._server.start()
        await self._health.start()
        await self._gateway.start()

    async def stop(self) -> None:
        """Close every port at once: nothing it answers needs a grace."""
        await self._gateway.stop()
        await self._server.stop(None)
