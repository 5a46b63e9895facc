"""Failed calls as the REST bridge answers them: a ``google.rpc.Status`` JSON body and an HTTP status.

The HTTP status comes from the server's one table (``control.api.status.HTTP_STATUS``); the few gRPC
codes Corral never raises itself but the runtime can (CANCELLED, UNIMPLEMENTED, ...) follow
grpc-gateway's table. A rate-limited call carries ``Retry-After``.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import json_format
from google.rpc import error_details_pb2, status_pb2

from control.api.status import HTTP_STATUS, rich_status
from control.gateway.protojson import escaped
from corral.errors import CorralError

_RUNTIME_HTTP_STATUS = {"OK": 200, "CANCELLED": 499, "OUT_OF_RANGE": 400, "UNIMPLEMENTED": 501, "ABORTED": 409,
                        "DATA_LOSS": 500}  # fmt: skip
"""grpc-gateway's mapping for the codes that HTTP_STATUS leaves out."""

DETAILS_KEY = "grpc-status-details-bin"


class RpcFailure(Exception):
    """A call that ended with a non-OK status: the code, the message and the rich details."""

    def __init__(
        self, code: grpc.StatusCode, message: str, details: list[Any] | None = None, retry_after: str = ""
    ) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.details = details or []
        self.retry_after = retry_after

    @classmethod
    def from_trailers(
        cls, code: grpc.StatusCode, message: str, trailers: tuple[tuple[str, str | bytes], ...] | Any
    ) -> RpcFailure:
        """From a status and its trailing metadata (``grpc-status-details-bin``, ``retry-after``)."""
        details: list[Any] = []
        retry_after = ""
        for key, value in trailers or ():
            if key == DETAILS_KEY and isinstance(value, bytes):
                details = list(status_pb2.Status.FromString(value).details)
            elif key == "retry-after":
                retry_after = value if isinstance(value, str) else value.decode()
        return cls(code, message, details, retry_after)

    @classmethod
    def from_error(cls, err: CorralError) -> RpcFailure:
        """From a domain error, through the server's table (BadRequest naming the field, RetryInfo). A lone
        surrogate in its text (quoting a JSON key the caller sent) is escaped (``\\ud800``): no proto string
        can hold one, and building the answer must not fail while answering an error."""
        code, message, trailers = rich_status(_escaped(err))
        return cls.from_trailers(code, message, trailers)

    @property
    def http_status(self) -> int:
        """The answer's HTTP status: the server's table, else grpc-gateway's for a runtime code, else 500."""
        name = self.code.name
        return HTTP_STATUS.get(name) or _RUNTIME_HTTP_STATUS.get(name, 500)

    def to_json(self) -> dict[str, Any]:
        """The ``google.rpc.Status`` JSON: ``{"code": 3, "message": ..., "details": [...]}``."""
        return {
            "code": self.code.value[0],
            "message": self.message,
            "details": [json_format.MessageToDict(d) for d in self.details],
        }

    def headers(self) -> dict[str, str]:
        """Headers the answer carries besides the body: ``Retry-After`` for a rate-limited call, else none."""
        return {"Retry-After": self.retry_after} if self.retry_after else {}


def _escaped(err: CorralError) -> CorralError:
    """``err``, or when its text holds a lone surrogate, a copy with that text escaped."""
    texts = {name: value for name, value in vars(err).items() if isinstance(value, str)}
    if all(escaped(text) == text for text in texts.values()):
        return err
    out = type(err).__new__(type(err))  # not __init__: each error class takes arguments of its own
    out.__dict__.update(vars(err), **{name: escaped(text) for name, text in texts.items()})
    return out


# The detail types must be known to the descriptor pool for Any -> JSON.
_KNOWN_DETAILS = (error_details_pb2.BadRequest, error_details_pb2.RetryInfo)
