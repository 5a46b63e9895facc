"""How the REST bridge reaches the services: in-process (the default) or over loopback gRPC.

* :class:`InProcess` awaits the servicer's method directly with a small stand-in for the
  ``ServicerContext`` (metadata in, ``abort`` out as :class:`RpcFailure`). No serialisation, no
  second HTTP/2 hop: the bridge costs only the JSON work. Everything a servicer does (validation,
  the error table, idempotency) is shared; gRPC server interceptors are not on this path, so the
  bridge applies the request-id rule itself.
* :class:`Loopback` calls the process's own gRPC port, as grpc-gateway does: the exact gRPC path,
  interceptors included, at the price of a serialise/parse and a loopback round trip per call.

``CORRAL_GATEWAY_MODE`` picks one; ``bench/rest.py`` measures both. A request too large for the loopback
channel to send is INVALID_ARGUMENT, as the same request in-process is refused for its size: gRPC's own
client-side RESOURCE_EXHAUSTED would be a 429 that tells the client to send it again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any, NoReturn, Protocol

import grpc
from google.protobuf import message_factory
from google.protobuf.message import Message

from control.gateway.rules import Route
from control.gateway.status import RpcFailure
from corral.errors import InvalidArgument

Metadata = tuple[tuple[str, str], ...]


class Invoker(Protocol):
    """Calls one RPC of a route; failures are :class:`RpcFailure`."""

    async def unary(self, route: Route, request: Message, metadata: Metadata) -> Message:
        """The response of the unary RPC of ``route`` to ``request``, called with ``metadata`` (the request
        id, and the idempotency key and authorization when given)."""
        ...

    def stream(
        self, route: Route, request: Message | AsyncIterator[Message], metadata: Metadata
    ) -> AsyncIterator[Message]:
        """A server stream; ``request``: the request, or for a client-streaming route its messages."""
        ...

    async def close(self) -> None:
        """Release what the invoker holds (a channel); the gateway calls it as it stops."""
        ...


class _Context:
    """The part of ``grpc.aio.ServicerContext`` that servicers use, for in-process calls."""

    def __init__(self, metadata: Metadata) -> None:
        self._metadata = metadata
        self._trailers: tuple[tuple[str, str | bytes], ...] = ()

    def invocation_metadata(self) -> Metadata:
        return self._metadata

    def set_trailing_metadata(self, trailing_metadata: tuple[tuple[str, str | bytes], ...]) -> None:
        self._trailers = tuple(trailing_metadata)

    def time_remaining(self) -> float | None:
        return None

    def cancelled(self) -> bool:
        return False

    async def send_initial_metadata(self, metadata: Metadata) -> None:
        return None

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: tuple[tuple[str, str | bytes], ...] = ()
    ) -> NoReturn:
        raise RpcFailure.from_trailers(code, details, tuple(trailing_metadata) or self._trailers)


class InProcess:
    """Calls the servicers' methods on this event loop."""

    def __init__(self, servicers: Mapping[str, object]) -> None:
        self.servicers = dict(servicers)
        """Service full name (``corral.v1.JobService``) -> servicer."""

    def _method(self, route: Route) -> Any:
        return getattr(self.servicers[route.service.full_name], route.method.name)

    async def unary(self, route: Route, request: Message, metadata: Metadata) -> Message:
        """Await the servicer's method; its ``context.abort`` raises :class:`RpcFailure`."""
        response: Message = await self._method(route)(request, _Context(metadata))
        return response

    async def stream(
        self, route: Route, request: Message | AsyncIterator[Message], metadata: Metadata
    ) -> AsyncIterator[Message]:
        """The servicer's messages as it yields them; its ``context.abort`` raises :class:`RpcFailure`."""
        async for item in self._method(route)(request, _Context(metadata)):
            yield item

    async def close(self) -> None:
        """Nothing to release: the servicers belong to the gRPC server."""
        return None


class Loopback:
    """Calls the services over a gRPC channel to ``target`` (this process's own port)."""

    def __init__(self, target: str, max_message_bytes: int) -> None:
        self.max_message_bytes = max_message_bytes
        """The largest message the channel sends (and receives)."""
        self.channel = grpc.aio.insecure_channel(
            target,
            options=[
                ("grpc.max_receive_message_length", max_message_bytes),
                ("grpc.max_send_message_length", max_message_bytes),
            ],
        )
        self._callables: dict[str, Any] = {}

    def _callable(self, route: Route) -> Any:
        path = f"/{route.service.full_name}/{route.method.name}"
        fn = self._callables.get(path)
        if fn is None:
            request_cls = message_factory.GetMessageClass(route.method.input_type)
            response_cls = message_factory.GetMessageClass(route.method.output_type)
            if route.client_streaming:
                make = self.channel.stream_stream
            else:
                make = self.channel.unary_stream if route.streaming else self.channel.unary_unary
            fn = self._callables[path] = make(
                path, request_serializer=request_cls.SerializeToString, response_deserializer=response_cls.FromString
            )
        return fn

    async def unary(self, route: Route, request: Message, metadata: Metadata) -> Message:
        """Call the method over the channel, interceptors included; a non-OK status raises :class:`RpcFailure`."""
        self._check_size(request)
        try:
            response: Message = await self._callable(route)(request, metadata=metadata)
        except grpc.aio.AioRpcError as err:
            raise self._failure(err) from None
        return response

    async def stream(
        self, route: Route, request: Message | AsyncIterator[Message], metadata: Metadata
    ) -> AsyncIterator[Message]:
        """The call's messages as they arrive; a non-OK status raises :class:`RpcFailure`. The call is
        cancelled however the iteration ends (a client that went away ends it)."""
        too_large: list[int] = []
        if isinstance(request, Message):
            self._check_size(request)
        else:
            request = self._sized(request, too_large)
        call = self._callable(route)(request, metadata=metadata)
        try:
            async for item in call:
                yield item
        except (grpc.aio.AioRpcError, asyncio.CancelledError) as err:
            if too_large:
                raise self._too_large(too_large[0]) from None
            if isinstance(err, asyncio.CancelledError):
                raise
            raise self._failure(err) from None
        finally:
            call.cancel()

    async def _sized(self, messages: AsyncIterator[Message], too_large: list[int]) -> AsyncIterator[Message]:
        """``messages`` as long as each can be sent; the first that cannot is noted in ``too_large`` and
        ends the call (gRPC would end it INTERNAL, "Internal error from Core")."""
        async for message in messages:
            size = message.ByteSize()
            if size > self.max_message_bytes:
                too_large.append(size)
                raise asyncio.CancelledError
            yield message

    async def close(self) -> None:
        """Close the channel: calls still in progress on it are cancelled."""
        await self.channel.close()

    def _too_large(self, size: int | None) -> RpcFailure:
        how_large = f"is {size} bytes as protobuf, over" if size is not None else "is over"
        return RpcFailure.from_error(
            InvalidArgument(
                "",
                f"the request {how_large} the {self.max_message_bytes} bytes a call to the control plane may "
                "carry: send less in one call (fewer jobs, smaller payloads)",
            )
        )

    def _check_size(self, request: Message) -> None:
        """Refuse a request the channel could not send (a batch whose JSON is within the body limit may
        take several times as many bytes encoded)."""
        size = request.ByteSize()
        if size > self.max_message_bytes:
            raise self._too_large(size)

    def _failure(self, err: grpc.aio.AioRpcError) -> RpcFailure:
        """The call's status as the bridge answers it; the channel's own refusal to send a message too
        large (a client-streaming call's messages are not sized beforehand) is INVALID_ARGUMENT."""
        details = err.details() or ""
        if err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and _SENT_TOO_LARGE in details:
            return self._too_large(None)
        return RpcFailure.from_trailers(err.code(), details, err.trailing_metadata())


_SENT_TOO_LARGE = "Sent message larger than max"
"""gRPC's words when the client side will not send a message over ``grpc.max_send_message_length``."""
