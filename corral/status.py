"""The one translation on the client side from ``grpc.RpcError`` to :mod:`corral.errors`.

Both :class:`corral.Client` and :class:`corral.AsyncClient` wrap every call in :func:`translate_errors`,
which raises :func:`error_from_rpc`. The exception class comes from ``ERRORS_BY_CODE[code.name]``; the
control plane's rich details complete it:

- ``grpc-status-details-bin`` trailer: a serialized ``google.rpc.Status`` whose ``details`` may hold a
  ``BadRequest`` (its first field violation gives ``InvalidArgument.field`` and ``.rule``) and a
  ``RetryInfo`` (``retry_delay``);
- ``retry-after`` trailer (seconds) on RESOURCE_EXHAUSTED, preferred over ``RetryInfo`` for ``RateLimited``.

RESOURCE_EXHAUSTED is a :class:`~corral.errors.RateLimited` only when it carries the control plane's
rate-limit signal (a ``retry-after`` trailer or a ``RetryInfo`` detail, both sent by
``control/api/status.py``). gRPC uses the same code for a request or an answer over the message size
limit ("SERVER: Received message larger than max (N vs. M)"): that one is a
:class:`~corral.errors.MessageTooLarge`, and any other a plain ``CorralError``, since waiting and
sending the same call again would meet the same refusal for ever (or carry out a committed batch twice).

Status codes without a class of their own (UNKNOWN, CANCELLED, ABORTED, UNIMPLEMENTED, ...) become a plain
:class:`~corral.errors.CorralError` whose ``code`` is the status code's name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import grpc
from google.rpc import code_pb2, error_details_pb2, status_pb2

from corral.errors import ERRORS_BY_CODE, CorralError, InvalidArgument, MessageTooLarge, RateLimited

__all__ = ["DEFAULT_RETRY_AFTER", "error_from_rpc", "error_from_status", "translate_errors"]

DEFAULT_RETRY_AFTER = 1.0
"""Seconds a :class:`RateLimited` suggests when the server named no delay."""

_DETAILS_KEY = "grpc-status-details-bin"
_RETRY_AFTER_KEY = "retry-after"
_TOO_LARGE = re.compile(r"(?:\b(CLIENT|SERVER): )?(Sent|Received) message larger than max \((\d+) vs\. (\d+)\)")
"""gRPC core's words for a message over the size limit, after the side that noticed (``CLIENT``/``SERVER``)
when the gRPC in use names it; without the side, "Received" could be either message."""
# Which message was too large, by the side that noticed and what it was doing.
_WHICH = {
    ("CLIENT", "Sent"): "request",
    ("SERVER", "Received"): "request",
    ("SERVER", "Sent"): "answer",
    ("CLIENT", "Received"): "answer",
}


@contextmanager
def translate_errors() -> Iterator[None]:
    """Run the body, re-raising any ``grpc.RpcError`` as the matching :class:`CorralError`."""
    try:
        yield
    except grpc.RpcError as exc:
        raise error_from_rpc(exc) from exc


def error_from_rpc(exc: grpc.RpcError) -> CorralError:
    """Return the :class:`CorralError` that stands for a failed call (sync or ``grpc.aio``)."""
    code = _call(exc, "code")
    name = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
    message = _call(exc, "details") or (str(code.value[1]) if isinstance(code, grpc.StatusCode) else str(exc))
    trailers = _trailers(exc)
    status = _rich_status(trailers.get(_DETAILS_KEY))
    error = _error(name, message, trailers, status)
    error.answered = status is not None  # the control plane sends its rich status with every error
    return error


def error_from_status(status: status_pb2.Status) -> CorralError:
    """Return the :class:`CorralError` that a ``google.rpc.Status`` sent as data stands for (a RunJobs
    stream's answer to a submission it refused), as :func:`error_from_rpc` reads the same status from a
    failed call's trailer."""
    name = code_pb2.Code.Name(status.code) if status.code in code_pb2.Code.values() else "UNKNOWN"
    error = _error(name, status.message, {}, status)
    error.answered = True
    return error


def _error(name: str, message: str, trailers: dict[str, Any], status: status_pb2.Status | None) -> CorralError:
    if name == InvalidArgument.code:
        violation = _unpack(status, error_details_pb2.BadRequest)
        if violation is not None and violation.field_violations:
            first = violation.field_violations[0]
            return InvalidArgument(first.field, first.description or message)
        return InvalidArgument("", message)
    if name == RateLimited.code:
        if _RETRY_AFTER_KEY in trailers or _unpack(status, error_details_pb2.RetryInfo) is not None:
            return RateLimited(message, _retry_after(trailers.get(_RETRY_AFTER_KEY), status))
        too_large = _TOO_LARGE.search(message)
        if too_large is not None:
            side, verb, size, limit = too_large.groups()
            return MessageTooLarge(_WHICH.get((side, verb), "request or answer"), int(size), int(limit))
        error = CorralError(message)
        error.code = name
        return error
    cls = ERRORS_BY_CODE.get(name)
    if cls is not None:
        return cls(message)
    error = CorralError(message)
    error.code = name
    return error


def _call(exc: grpc.RpcError, method: str) -> Any:
    fn = getattr(exc, method, None)
    try:
        return fn() if callable(fn) else None
    except Exception:  # a half-built RpcError: fall back to the defaults
        return None


def _trailers(exc: grpc.RpcError) -> dict[str, Any]:
    metadata: Iterable[tuple[str, Any]] | None = _call(exc, "trailing_metadata")
    out: dict[str, Any] = {}
    for key, value in metadata or ():
        out.setdefault(key.lower(), value)
    return out


def _rich_status(raw: Any) -> status_pb2.Status | None:
    if not isinstance(raw, bytes | bytearray):
        return None
    status = status_pb2.Status()
    try:
        status.ParseFromString(bytes(raw))
    except Exception:  # a malformed trailer must not hide the error itself
        return None
    return status


def _unpack(status: status_pb2.Status | None, cls: Any) -> Any:
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(cls.DESCRIPTOR):
            message = cls()
            detail.Unpack(message)
            return message
    return None


def _retry_after(header: Any, status: status_pb2.Status | None) -> float:
    if header is not None:
        try:
            seconds = float(header.decode() if isinstance(header, bytes) else header)
            if math.isfinite(seconds) and seconds >= 0:
                return seconds
        except ValueError:
            pass
    info = _unpack(status, error_details_pb2.RetryInfo)
    if info is not None and info.HasField("retry_delay"):
        return float(info.retry_delay.seconds + info.retry_delay.nanos / 1e9)
    return DEFAULT_RETRY_AFTER
