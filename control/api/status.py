"""THE table from domain errors to gRPC status codes, and the one decorator that applies it.

Servicers never call ``context.abort`` themselves: they raise ``corral.errors.*`` and the
:func:`grpc_errors` decorator turns the error into a status with rich ``google.rpc`` details
(BadRequest naming the field, RetryInfo) and, for rate limits, a ``retry-after`` trailer. The REST
bridge reuses :data:`HTTP_STATUS` for the same errors.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from corral.errors import CorralError, Internal, InvalidArgument, RateLimited

logger = logging.getLogger(__name__)

STATUS: dict[str, grpc.StatusCode] = {
    "INVALID_ARGUMENT": grpc.StatusCode.INVALID_ARGUMENT,
    "NOT_FOUND": grpc.StatusCode.NOT_FOUND,
    "ALREADY_EXISTS": grpc.StatusCode.ALREADY_EXISTS,
    "FAILED_PRECONDITION": grpc.StatusCode.FAILED_PRECONDITION,
    "RESOURCE_EXHAUSTED": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "UNAUTHENTICATED": grpc.StatusCode.UNAUTHENTICATED,
    "PERMISSION_DENIED": grpc.StatusCode.PERMISSION_DENIED,
    "UNAVAILABLE": grpc.StatusCode.UNAVAILABLE,
    "DEADLINE_EXCEEDED": grpc.StatusCode.DEADLINE_EXCEEDED,
    "INTERNAL": grpc.StatusCode.INTERNAL,
    "UNKNOWN": grpc.StatusCode.UNKNOWN,
}
"""Error code name (CorralError.code) -> gRPC status code."""

HTTP_STATUS: dict[str, int] = {
    "INVALID_ARGUMENT": 400,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "FAILED_PRECONDITION": 400,
    "RESOURCE_EXHAUSTED": 429,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
    "INTERNAL": 500,
    "UNKNOWN": 500,
}
"""Error code name -> HTTP status (grpc-gateway's table)."""


class Undecodable:
    """Stands in for a request whose bytes did not parse (e.g. a string field that is not UTF-8)."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason


def rich_status(err: CorralError) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str | bytes], ...]]:
    """The status code, message and trailing metadata for ``err``.

    Messages and rules are cut to MAX_MESSAGE characters: they may quote what the caller sent, and
    status and details travel as metadata, which gRPC limits to 16 KiB (beyond it the caller got
    RESOURCE_EXHAUSTED "Stream removed" instead of the error).
    """
    status = status_of(err)
    trailers: list[tuple[str, str | bytes]] = []
    if isinstance(err, RateLimited):
        trailers.append(("retry-after", str(math.ceil(err.retry_after))))
    trailers.append(("grpc-status-details-bin", status.SerializeToString()))
    return STATUS.get(err.code, grpc.StatusCode.UNKNOWN), status.message, tuple(trailers)


def status_of(err: CorralError) -> status_pb2.Status:
    """``err`` as a ``google.rpc.Status``: code, message (cut to MAX_MESSAGE characters) and details,
    BadRequest naming the field and RetryInfo for rate limits. What a call that fails sends in its
    ``grpc-status-details-bin`` trailer, and what a RunJobs stream sends for a refused submission."""
    code = STATUS.get(err.code, grpc.StatusCode.UNKNOWN)
    details: list[any_pb2.Any] = []
    if isinstance(err, InvalidArgument):
        bad = error_details_pb2.BadRequest()
        bad.field_violations.add(field=_bounded(err.field), description=_bounded(err.rule))
        packed = any_pb2.Any()
        packed.Pack(bad)
        details.append(packed)
    if isinstance(err, RateLimited):
        info = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=math.ceil(err.retry_after)))
        packed = any_pb2.Any()
        packed.Pack(info)
        details.append(packed)
    return status_pb2.Status(
        code=getattr(code_pb2, code.name, code_pb2.UNKNOWN), message=_bounded(err.message), details=details
    )


MAX_MESSAGE = 1024
"""Longest error message (and field rule) sent, in characters; see :func:`rich_status`."""


def _bounded(text: str) -> str:
    if len(text) <= MAX_MESSAGE:
        return text
    half = MAX_MESSAGE // 2 - 3
    return f"{text[:half]} ... {text[-half:]}"


F = TypeVar("F", bound=Callable[..., Any])


def _as_error(exc: Exception, method: str) -> CorralError:
    if isinstance(exc, CorralError):
        return exc
    logger.exception("rpc_failed", extra={"method": method})
    return Internal(f"{method} failed: {type(exc).__name__}")


def grpc_errors(fn: F) -> F:
    """Map CorralError (and bugs, as INTERNAL) raised by a servicer method to a gRPC status."""
    name = fn.__name__
    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        async def stream(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                if isinstance(request, Undecodable):
                    raise InvalidArgument(request.field, request.reason)
                async for item in fn(self, request, context):
                    yield item
            except Exception as exc:
                code, message, trailers = rich_status(_as_error(exc, name))
                await context.abort(code, message, trailing_metadata=trailers)

        return stream  # type: ignore[return-value]

    @functools.wraps(fn)
    async def unary(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            if isinstance(request, Undecodable):
                raise InvalidArgument(request.field, request.reason)
            return await fn(self, request, context)
        except Exception as exc:
            code, message, trailers = rich_status(_as_error(exc, name))
            await context.abort(code, message, trailing_metadata=trailers)

    return unary  # type: ignore[return-value]
