"""The gRPC surface of the control plane.

Modules: ``jobs`` (JobServicer), ``workers`` (WorkerServicer.Connect), ``admin`` (AdminServicer),
``accounts`` (AccountServicer),
``health`` (liveness/readiness), ``convert`` (proto <-> domain), ``status`` (error -> status table),
``decode`` (request parsing that names the field a bad byte sequence sits in), ``interceptors``
(request ids, authentication), ``identity`` (who is calling).

:func:`create_server` builds the server; it registers every RPC of the four corral.v1 services
with request deserializers that turn undecodable bytes into an INVALID_ARGUMENT naming the field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message
from grpc_reflection.v1alpha import reflection

from control.api.accounts import AccountServicer
from control.api.admin import AdminServicer
from control.api.decode import find_invalid_utf8
from control.api.health import Health
from control.api.interceptors import Authenticate, RequestIds
from control.api.jobs import JobServicer
from control.api.status import Undecodable
from control.api.workers import WorkerServicer
from control.auth import Authenticator
from control.tls import ServerTls
from corral.v1 import accounts_pb2, admin_pb2, jobs_pb2, workers_pb2

__all__ = [
    "AccountServicer",
    "AdminServicer",
    "Health",
    "JobServicer",
    "WorkerServicer",
    "add_port",
    "create_server",
    "server_credentials",
    "service_handlers",
]

MAX_MESSAGE_BYTES = 64 << 20
MAX_PENDING_CALLS = 20_000
"""Calls that may wait to be taken up at once (a burst of clients); past it gRPC cancels new ones."""
HANDSHAKE_TIMEOUT_SEC = 10.0
"""A connection that has not finished its handshake by then is closed (gRPC's default is 120 s): 20,000
TCP connections that said nothing held as many descriptors, up to the process's limit, and a worker
that then had to reconnect could not."""
IDLE_CONNECTION_SEC = 300.0
"""A connection with no call on it for this long is told to go (GOAWAY): one that sent the HTTP/2
preface and nothing after was held for good. A client's channel reconnects at its next call; a worker's
stream is a call, so its connection is never idle."""

SERVICES: tuple[ServiceDescriptor, ...] = (
    jobs_pb2.DESCRIPTOR.services_by_name["JobService"],
    workers_pb2.DESCRIPTOR.services_by_name["WorkerService"],
    admin_pb2.DESCRIPTOR.services_by_name["AdminService"],
    accounts_pb2.DESCRIPTOR.services_by_name["AccountService"],
)


def _deserializer(cls: type[Message]) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except DecodeError as exc:
            field = find_invalid_utf8(cls.DESCRIPTOR, data)
            if field is not None:
                return Undecodable(field, "is not valid UTF-8")
            return Undecodable("", f"request is not a valid {cls.DESCRIPTOR.full_name}: {exc}")

    return parse


def service_handlers(service: ServiceDescriptor, servicer: object) -> grpc.GenericRpcHandler:
    """A handler for every method of ``service``, bound to the servicer's method of the same name."""
    from google.protobuf import message_factory

    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in service.methods:
        fn = getattr(servicer, method.name)
        req = message_factory.GetMessageClass(method.input_type)
        resp = message_factory.GetMessageClass(method.output_type)
        kind = (method.client_streaming, method.server_streaming)
        make = {
            (False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler,
        }[kind]
        handlers[method.name] = make(
            fn, request_deserializer=_deserializer(req), response_serializer=resp.SerializeToString
        )
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


def server_credentials(tls: ServerTls, *, require_client_cert: bool = False) -> grpc.ServerCredentials:
    """TLS credentials of a port; ``require_client_cert``: mutual TLS against ``tls.client_ca``."""
    pairs = [(tls.private_key, tls.cert_chain)]
    if require_client_cert:
        return grpc.ssl_server_credentials(pairs, root_certificates=tls.client_ca, require_client_auth=True)
    return grpc.ssl_server_credentials(pairs)


def add_port(server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None) -> int:
    """Listen on ``address`` too (TLS with ``credentials``, else plaintext); returns the bound port.

    Raises:
        OSError: the address cannot be bound (in use, or not an address of this machine).
    """
    try:
        port: int = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    except RuntimeError:  # what grpcio raises for a failed bind; its own message only says to turn on debug logs
        port = 0
    if port == 0:
        raise OSError(f"cannot listen on {address}: the port is in use or the address is not one of this machine")
    return port


def create_server(
    jobs: JobServicer,
    workers: WorkerServicer,
    admin: AdminServicer,
    accounts: AccountServicer,
    health: Health,
    *,
    auth: Authenticator | None = None,
) -> grpc.aio.Server:
    """The gRPC server with every service, health and reflection, listening on no port yet (see
    :func:`add_port`, which can fail: the caller holds the server by then and can stop it).

    ``auth``: who may call what (no interceptor at all without it).
    """
    interceptors: list[grpc.aio.ServerInterceptor] = [RequestIds()]
    if auth is not None:
        interceptors.append(Authenticate(auth))  # inside RequestIds: a refusal carries the request id too
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
            ("grpc.keepalive_permit_without_calls", 1),
            # The least time between a client's pings on a quiet connection before they count as abuse
            # (GOAWAY too_many_pings): workers ping every few seconds to notice a connection that went
            # silent (worker.connection.KEEPALIVE_SEC).
            ("grpc.http2.min_ping_interval_without_data_ms", 1000),
            # Calls that arrived but that the server has not taken up yet. gRPC cancels every call past
            # its default of 1,000 (CANCELLED, no details), and grpc.aio takes calls up one at a time:
            # a burst of 3,000 concurrent GetStats lost 658 that way. These wait their turn instead.
            ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
            ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_CALLS),
            ("grpc.server_handshake_timeout_ms", int(HANDSHAKE_TIMEOUT_SEC * 1000)),
            ("grpc.max_connection_idle_ms", int(IDLE_CONNECTION_SEC * 1000)),
        ],
    )
    for service, servicer in zip(SERVICES, (jobs, workers, admin, accounts), strict=True):
        server.add_generic_rpc_handlers((service_handlers(service, servicer),))
    health.add_to(server)
    names = [s.full_name for s in SERVICES] + [health.SERVICE_NAME, reflection.SERVICE_NAME]
    reflection.enable_server_reflection(names, server)
    return server
