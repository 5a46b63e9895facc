"""Server interceptors of the gRPC surface.

:class:`RequestIds`: every call has a request id, taken from the ``x-request-id`` metadata when the
client sent a usable one, else made (a uuid4 in hex), and returned as ``x-request-id`` in the trailing
metadata of every call, unary or streaming, error or not. Trailers travel with the status for free,
while grpc.aio sends explicit initial metadata as a batch of its own: that cost about 140 µs per
unary call, and put a round of its own before the first message of every WatchJob. A client that
needs the id while a stream is still open sends its own. The REST bridge applies the same rule to
the ``X-Request-ID`` header (:func:`request_id`).

:class:`Authenticate` (installed only when some role needs credentials): checks each call's bearer
token for the role of its service (:mod:`control.auth`) before the servicer runs, so a refused call
changes nothing. A refused call gets a handler of the same shape that aborts with UNAUTHENTICATED
(through the error table, so the status carries the same rich details as every other error) without
reading the request. An accepted call runs the servicer's own handler unchanged, with its principal in
:data:`control.identity.PRINCIPAL`: grpc.aio runs each call's interceptors and handler in one task,
so the context variable set here is the one the handler reads. Only WorkerService calls are wrapped,
when workers need a certificate: the TLS session is visible from the servicer context alone.
"""

from __future__ import annotations

import inspect
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc

from control.api.status import rich_status
from control.auth import Authenticator, Role, role_of
from control.identity import PEER, PRINCIPAL
from corral import logs
from corral.errors import Unauthenticated

logger = logging.getLogger(__name__)

REQUEST_ID = "x-request-id"
"""The metadata key (and, capitalised, the HTTP header) that carries the request id."""
MAX_REQUEST_ID = 128


def request_id(given: str | bytes | None) -> str:
    """``given`` when it is 1..128 printable ASCII characters without spaces, else a new id."""
    if isinstance(given, bytes):
        given = given.decode("ascii", "replace")
    if given and len(given) <= MAX_REQUEST_ID and all("!" <= c <= "~" for c in given):
        return given
    return uuid.uuid4().hex


def _from_metadata(metadata: Sequence[tuple[str, str | bytes]] | None) -> str:
    for key, value in metadata or ():
        if key == REQUEST_ID:
            return request_id(value)
    return request_id(None)


Behavior = Callable[[Any, grpc.aio.ServicerContext], Any]
Metadata = tuple[tuple[str, str], ...]


class _Trailing:
    """A ServicerContext that adds ``metadata`` to whatever trailing metadata the servicer sets or aborts with."""

    __slots__ = ("_context", "_metadata")

    def __init__(self, context: grpc.aio.ServicerContext, metadata: Metadata) -> None:
        self._context = context
        self._metadata = metadata

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    def set_trailing_metadata(self, trailing_metadata: Sequence[tuple[str, str | bytes]]) -> None:
        self._context.set_trailing_metadata((*trailing_metadata, *self._metadata))

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Sequence[tuple[str, str | bytes]] = ()
    ) -> None:
        await self._context.abort(code, details, (*trailing_metadata, *self._metadata))


def _wrap(fn: Behavior, metadata: Metadata) -> Behavior:
    """``fn`` that returns ``metadata`` with the status, as trailing metadata (error or not). Same shape
    as ``fn``: coroutine or async generator."""
    if inspect.isasyncgenfunction(fn):

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            logs.current_request.set(metadata[0][1])
            # Who holds the stream, for the bounds on each client's open watches (control.feeds), which do
            # not see the context; a few µs, once per stream.
            PEER.set(context.peer())
            context.set_trailing_metadata(metadata)
            async for item in fn(request, _Trailing(context, metadata)):
                yield item

        return stream

    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        # Each call runs in a task of its own: the id tags the log lines of this call (and its jobs) only.
        logs.current_request.set(metadata[0][1])
        context.set_trailing_metadata(metadata)
        result = fn(request, _Trailing(context, metadata))
        return await result if inspect.isawaitable(result) else result

    return call


_MAKERS: dict[tuple[bool, bool], Callable[..., grpc.RpcMethodHandler]] = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}
_ATTRS = {(False, False): "unary_unary", (False, True): "unary_stream", (True, False): "stream_unary",
          (True, True): "stream_stream"}  # fmt: skip


class RequestIds(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Takes or makes each call's request id and returns it (see the module docstring)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """The call's handler, wrapped to carry its request id (log lines, trailers); None for a method not served."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        kind = (bool(handler.request_streaming), bool(handler.response_streaming))
        metadata = ((REQUEST_ID, _from_metadata(handler_call_details.invocation_metadata)),)
        return _MAKERS[kind](
            _wrap(getattr(handler, _ATTRS[kind]), metadata),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


AUTHORIZATION = "authorization"
"""The metadata key of the bearer token (the REST bridge passes the ``Authorization`` header on as it)."""


def _metadata_value(metadata: Sequence[tuple[str, str | bytes]] | None, key: str) -> str | bytes | None:
    for k, value in metadata or ():
        if k == key:
            return value
    return None


def _refusal(handler: grpc.RpcMethodHandler, err: Unauthenticated, method: str) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s shape that logs the refusal, aborts with ``err`` and never parses the request."""
    code, message, trailers = rich_status(err)

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
        # Logged here, inside the request-id wrapper, so the line carries the call's request id. Info,
        # not warning: a misconfigured client that keeps retrying would flood a warning-level log.
        logger.info(logs.AUTH_REFUSED, extra={"method": method, "peer": context.peer(), "reason": err.message})
        await context.abort(code, message, trailing_metadata=trailers)

    kind = (bool(handler.request_streaming), bool(handler.response_streaming))
    return _MAKERS[kind](refuse, request_deserializer=None, response_serializer=handler.response_serializer)


def _with_certificate(handler: grpc.RpcMethodHandler, principal: str) -> grpc.RpcMethodHandler:
    """``handler`` that first requires a client certificate verified in this call's TLS session."""
    kind = (bool(handler.request_streaming), bool(handler.response_streaming))
    fn = getattr(handler, _ATTRS[kind])
    code, message, trailers = rich_status(
        Unauthenticated(
            "a worker must present a client certificate signed by CORRAL_TLS_CLIENT_CA: connect to the worker"
            " port (CORRAL_WORKER_PORT) with --tls-cert and --tls-key"
        )
    )

    async def verify(context: grpc.aio.ServicerContext) -> None:
        # None unless the handshake verified a certificate, which only the worker port asks for.
        identities = context.peer_identities()
        if not identities:
            await context.abort(code, message, trailing_metadata=trailers)
            return
        PRINCIPAL.set(f"{principal}:{identities[0].decode('utf-8', 'replace')}")

    if inspect.isasyncgenfunction(fn):

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await verify(context)
            async for item in fn(request, context):
                yield item

        behavior: Behavior = stream
    else:

        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await verify(context)
            result = fn(request, context)
            return await result if inspect.isawaitable(result) else result

        behavior = call
    return _MAKERS[kind](
        behavior, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )


class Authenticate(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses calls without the credentials their service's role needs (see the module docstring)."""

    def __init__(self, auth: Authenticator) -> None:
        self._auth = auth
        self._roles: dict[str, Role] = {}

    def _role(self, method: str, served: bool) -> Role:
        role = self._roles.get(method)
        if role is None:
            slash = method.rfind("/")
            role = role_of(method[1:slash], method[slash + 1 :])
            if served:  # only the methods served: names a caller makes up are not kept
                self._roles[method] = role
        return role

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        """The call's handler once its credentials pass for its service's role, with :data:`PRINCIPAL` set; else a
        handler that refuses the call. Open services and unknown methods pass unchanged; with ``worker_cert``, a worker
        call first needs a verified client certificate."""
        handler = await continuation(handler_call_details)
        role = self._role(handler_call_details.method, handler is not None)
        if handler is None or role is Role.OPEN:
            return handler
        authorization = _metadata_value(handler_call_details.invocation_metadata, AUTHORIZATION)
        try:
            principal = self._auth.authenticate(role, authorization)
        except Unauthenticated as err:
            return _refusal(handler, err, handler_call_details.method)
        if role is Role.WORKER and self._auth.worker_cert:
            return _with_certificate(handler, principal or "worker")
        PRINCIPAL.set(principal)
        return handler
