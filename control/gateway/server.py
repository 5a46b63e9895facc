"""Gateway: the control plane's HTTP server (aiohttp, on the same event loop as grpc.aio).

* ``/healthz``: liveness (the event loop answers). ``/readyz``: 200 while ready, else 503 with the
  reason; the same rule as the gRPC health service's ``corral.v1.JobService``. ``/health`` and
  ``/ready`` are the same two under the names some probes use.
* ``/metrics``: the Prometheus text exposition of the process's own registry.
* ``/ui``: the built-in dashboard (``/`` redirects to it), a page and its files with no data in them
  (:mod:`control.gateway.ui`); the page's script calls the REST bridge like any other client.
* Everything else: the REST bridge. The route comes from the ``google.api.http`` annotations
  (:mod:`control.gateway.rules`), the request message from the path, the query string and the JSON
  body (:mod:`control.gateway.protojson`), the call goes through an :class:`Invoker`, and the answer
  is protojson, or a ``google.rpc.Status`` JSON with the HTTP status of the error table. A server
  stream (WatchJob) is newline-delimited JSON, one ``{"result": ...}`` per message and
  ``{"error": ...}`` if it fails, as grpc-gateway writes it.

Headers: ``Idempotency-Key`` (or ``X-Idempotency-Key``) becomes the ``idempotency-key`` metadata, ``Authorization`` is passed
on (each of them given twice is a 400: which one was meant cannot be told), and ``X-Request-ID`` is taken or
made and returned on every response. A body in a ``Content-Encoding`` other than gzip, deflate, br, zstd
(the last two when aiohttp has their libraries) or identity, or one that does not decode as it says, is a 400.

Auth: with client tokens configured, every bridge request (any path but the ones above, which probes,
Prometheus and a browser reach without credentials) needs ``Authorization: Bearer <client token>``; without one
it is a 401 with a ``google.rpc.Status`` body and ``WWW-Authenticate: Bearer``, before anything is
parsed or called. The caller's principal is set in :data:`control.identity.PRINCIPAL` for the
services to see. With an ``ssl_context`` the port speaks HTTPS only.

Connections: a request's headers, and each piece of its body, must come in time, and the open
connections are capped (:mod:`control.gateway.connections`, the :class:`HttpLimits`); what the
gateway sends back, a WatchJob stream for one, may take as long as it takes.

Web pages: a page on any site the user opens can have their browser send requests to this port
(a ``<form>``, ``fetch`` with ``mode: "no-cors"``), with no credentials needed when auth is off. So,
before anything else (auth included) and on every path:

* **Origin.** A request whose method is not GET, HEAD or OPTIONS and that carries an ``Origin`` header
  (browsers send one) is refused, 403 ``PERMISSION_DENIED``, unless that origin is this server: the
  scheme this port speaks, and the host and port of the request's ``Host`` (a default port left out of
  either). ``Origin: null`` is refused. A request without ``Origin`` (curl, scripts, client libraries)
  is not affected, and no Content-Type is required.
* **Host.** Bound to a loopback address (``CORRAL_HOST`` in 127.0.0.0/8, ``::1`` or ``localhost``: see
  :func:`loopback_bind`), a request whose ``Host`` is not a loopback IP, ``localhost`` or a
  ``*.localhost`` name is refused, 421 Misdirected Request (the request names a server that this one
  is not): a page on a name made to resolve to 127.0.0.1 (DNS rebinding) is same-origin to the
  browser, and could otherwise read what the port answers. Bound to a wildcard or a real interface,
  any Host is taken: the names a server is reached by there are the deployment's to choose, and auth
  is what protects it.

Both are ``google.rpc.Status`` JSON with an ``X-Request-ID``, and logged as the
``http_cross_site_refused`` warning once a minute at most. Every answer of the bridge, errors included,
is ``Cache-Control: no-store`` (a login's token, a job's payload or result); the dashboard's files keep
their own ``no-cache``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import ssl
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from typing import Any
from urllib.parse import urlsplit

import grpc
from aiohttp import compression_utils, web
from aiohttp.http import HttpVersion11
from aiohttp.http_exceptions import ContentEncodingError
from aiohttp.typedefs import Handler
from google.protobuf import message_factory
from google.protobuf.message import Message
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from control.api.interceptors import REQUEST_ID, request_id
from control.auth import Authenticator, Role, role_of
from control.gateway import protojson
from control.gateway.connections import (
    HANDLER_ARGS,
    NO_STORE,
    PROBE_PATHS,
    REQUEST_ID_HEADER,
    GuardedSite,
    HttpLimits,
    Throttled,
    headers_in,
)
from control.gateway.invoke import Invoker, Metadata
from control.gateway.rules import Route, Router
from control.gateway.status import RpcFailure
from control.gateway.ui import Dashboard
from control.identity import PEER, PRINCIPAL
from control.metrics import Metrics
from corral import logs
from corral.errors import InvalidArgument, Unauthenticated

logger = logging.getLogger(__name__)

JSON = "application/json"
NDJSON = "application/x-ndjson"
IDEMPOTENCY_HEADER = "Idempotency-Key"
"""The IETF HTTP API draft's header: an RFC 8941 quoted string (``"order-42"``), or a bare key."""
IDEMPOTENCY_HEADER_X = "X-Idempotency-Key"
"""The older spelling, a bare key; when both are given they must agree."""
CONTENT_ENCODING = "Content-Encoding"
CODINGS = frozenset(
    {"", "identity", "gzip", "deflate"}
    | ({"br"} if compression_utils.HAS_BROTLI else set())
    | ({"zstd"} if compression_utils.HAS_ZSTD else set())
)
"""The Content-Encodings of request bodies the bridge decodes (br and zstd when their libraries are there)."""
"""What a request body may be sent in: aiohttp decodes the four (br and zstd when their libraries are
installed; else it refuses them itself with a 400)."""
OFF_LOOP_BYTES = 64 << 10
"""A request body or an answer larger than this is parsed and converted (or converted and written) on a
worker thread, off the event loop that every other call and every worker's heartbeats share: a 12.6 MB
body of numbers held that loop 23 s. 64 KiB of numbers takes about 20 ms to parse and convert."""
ROUTE = web.RequestKey("route", str)
"""The route's name (``JobService.SubmitJob``, ``healthz``), the label of the request metrics."""
RID = web.RequestKey("request_id", str)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
"""Methods a request of which is served whatever its ``Origin``: they change nothing, and without CORS
headers in the answer the browser keeps it from a page of another origin."""
MISDIRECTED = 421
"""The answer to a ``Host`` that is not a loopback name on a loopback bind (RFC 9110 15.5.20: the
request was directed at a server that cannot answer for that authority)."""
_DEFAULT_PORTS = {"http": 80, "https": 443}


class Gateway:
    """``async with Gateway(...)``: serves HTTP on ``host:port`` (0 = any free port, see ``.port``)."""

    def __init__(
        self,
        host: str,
        port: int,
        invoker: Invoker,
        routes: list[Route],
        readiness: Callable[[], str | None],
        metrics: Metrics,
        max_body_bytes: int,
        shutdown_grace_sec: float = 5.0,
        *,
        auth: Authenticator | None = None,
        ssl_context: ssl.SSLContext | None = None,
        limits: HttpLimits | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.invoker = invoker
        self.router = Router(routes)
        self.readiness = readiness
        """None when ready, else why not."""
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.shutdown_grace_sec = shutdown_grace_sec
        self.auth = auth if auth is not None and auth.client_auth else None
        """Checks client tokens on the bridge; None when client calls need none."""
        self.ssl_context = ssl_context
        """HTTPS when set."""
        self.limits = limits or HttpLimits()
        """Deadlines on what clients send, and the cap on connections."""
        self.loopback_only = loopback_bind(host)
        """Bound to a loopback address: a request must name a loopback host (see the module docstring)."""
        self._runner: web.AppRunner | None = None
        self._request_types: dict[str, type[Message]] = {}
        self._refused_log = Throttled("http_cross_site_refused", logger)

    # ---- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Serve on ``host:port``; ``port`` is then the bound one (the one chosen when 0 was asked for).

        Raises:
            OSError: the address cannot be bound; the message names it.
        """
        app = web.Application(client_max_size=self.max_body_bytes, middlewares=[headers_in, self._same_site])
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/health", self._healthz)  # the names some probes and older setups use
        app.router.add_get("/ready", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        Dashboard.load().add_routes(app.router, ROUTE)
        # any path, newlines too
        app.router.add_route("*", r"/{tail:[\s\S]*}", self._bridge, expect_handler=self._expect)
        app.on_response_prepare.append(self._stamp)
        # handler_cancellation: a client that goes away ends its watch at once.
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=self.shutdown_grace_sec, **HANDLER_ARGS)
        await runner.setup()
        site = GuardedSite(runner, self.host, self.port, self.limits, ssl_context=self.ssl_context)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            why = os.strerror(exc.errno) if exc.errno else str(exc)  # asyncio's own text repeats the address
            raise OSError(f"cannot serve HTTP on {self.host}:{self.port}: {why}") from exc
        self._runner = runner
        self.port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        """Stop listening, let requests finish up to the grace, close the invoker. Idempotent."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
            await self.invoker.close()

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---- health and metrics ---------------------------------------------------------------------
    async def _healthz(self, request: web.Request) -> web.Response:
        request[ROUTE] = "healthz"
        return _json(200, {"status": "SERVING"})

    async def _readyz(self, request: web.Request) -> web.Response:
        request[ROUTE] = "readyz"
        reason = self.readiness()
        if reason is None:
            return _json(200, {"status": "SERVING"})
        return _json(503, {"status": "NOT_SERVING", "reason": reason})

    async def _metrics(self, request: web.Request) -> web.Response:
        request[ROUTE] = "metrics"
        resp = web.Response(body=generate_latest(self.metrics.registry))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    async def _stamp(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers[REQUEST_ID_HEADER] = _request_id(request)
        if "Cache-Control" not in response.headers:  # the dashboard's files say no-cache themselves
            response.headers.update(NO_STORE)
        self.metrics.http_requests.labels(request.get(ROUTE, "unmatched"), str(response.status)).inc()

    # ---- requests made by web pages -------------------------------------------------------------
    @web.middleware
    async def _same_site(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Refuse what a web page elsewhere makes the browser send (the module docstring says what)."""
        refusal = self._refusal(request)
        return refusal if refusal is not None else await handler(request)

    def _refusal(self, request: web.Request) -> web.Response | None:
        """The answer to a request that a page of another site (or a rebound name) sent, else None."""
        hosts = request.headers.getall("Host", ())
        status, why = 0, None
        if self.loopback_only:
            why = _not_loopback(hosts)
            status = MISDIRECTED
        if why is None and request.method not in SAFE_METHODS:
            scheme = "https" if self.ssl_context else "http"
            why = _foreign_origin(request.method, request.headers.getall("Origin", ()), hosts, scheme)
            status = 403
        if why is None:
            return None
        self._refused_log(
            route=f"{request.method} {request.path[:200]}", peer=_peer(request), status=status, reason=why
        )
        return _json(status, RpcFailure(grpc.StatusCode.PERMISSION_DENIED, why).to_json())

    # ---- the REST bridge ------------------------------------------------------------------------
    async def _bridge(self, request: web.Request) -> web.StreamResponse:
        PEER.set(_peer(request))  # who calls, for per-client rate limits (gRPC reads its own peer)
        logs.current_request.set(_request_id(request))  # log lines of this request (and the jobs it makes)
        if request.path in PROBE_PATHS:  # served without credentials for GET and HEAD: any other method is it
            return _method_not_allowed(("GET", "HEAD"))
        try:
            match = self.router.match(request.method, request.rel_url.raw_path)
        except UnicodeDecodeError:
            match = None
        # Credentials are checked before anything is said about the route, so that a caller without
        # them learns nothing (not even which paths exist) but how to log in.
        role = role_of(match.route.service.full_name, match.route.method.name) if match and match.route else Role.CLIENT
        if self.auth is not None:
            try:
                # The worker stream has no HTTP binding: a route needs a client's credentials, or none at all.
                PRINCIPAL.set(self.auth.authenticate(role, request.headers.get("Authorization")))
            except Unauthenticated as err:
                logger.info(
                    logs.AUTH_REFUSED,
                    extra={"route": f"{request.method} {request.path}", "peer": PEER.get(), "reason": err.message},
                )
                return _unauthorized(err, "Authorization" in request.headers)
        if match is None:
            return _failure(RpcFailure.from_error(InvalidArgument("", "the path is not valid UTF-8")))
        route = match.route
        if route is None:
            if match.allowed:
                return _method_not_allowed(match.allowed)
            return _json(404, RpcFailure(grpc.StatusCode.NOT_FOUND, "Not Found").to_json())
        request[ROUTE] = route.name
        try:
            if route.client_streaming:
                messages = await self._request_messages(route, request)
                return await self._stream(request, route, _each(messages), _metadata(request))
            message = await self._request_message(route, match.params, request)
            metadata = _metadata(request)
            if route.streaming:
                return await self._stream(request, route, message, metadata)
            # Shielded: a client that hangs up does not interrupt a submission half-way.
            response = await _shielded(self.invoker.unary(route, message, metadata))
        except InvalidArgument as err:
            return _failure(RpcFailure.from_error(err))
        except RpcFailure as failure:
            return _failure(failure)
        except Exception:
            logger.exception("http_bridge_failed", extra={"route": route.name})
            return _failure(RpcFailure(grpc.StatusCode.INTERNAL, f"{route.name} failed"))
        answer = getattr(response, route.response_body) if route.response_body else response
        return web.Response(status=200, body=await _encoded(answer), content_type=JSON)

    def _request_type(self, route: Route) -> type[Message]:
        cls = self._request_types.get(route.name)
        if cls is None:
            cls = self._request_types[route.name] = message_factory.GetMessageClass(route.method.input_type)
        return cls

    async def _expect(self, request: web.Request) -> web.StreamResponse | None:
        """``Expect: 100-continue``: a body that its Content-Length says is over the limit is refused before the
        client is told to send it (aiohttp's own handler said ``100 Continue`` first, and curl then sent
        megabytes only to be refused); else as aiohttp's does. aiohttp calls it before any middleware: a
        request from another site is refused here first."""
        refusal = self._refusal(request)
        if refusal is not None:
            return refusal
        announced = request.content_length
        coding = _ascii_header(request, CONTENT_ENCODING).lower()
        if coding in ("", "identity") and announced is not None and announced > self.max_body_bytes:
            return _failure(RpcFailure.from_error(_too_large(self.max_body_bytes, announced)))
        expect = request.headers.get("Expect", "")
        if request.version != HttpVersion11:
            return None
        if expect.lower() != "100-continue":
            raise web.HTTPExpectationFailed(text=f"Unknown Expect: {expect[:100]}")
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the answer proper has not started
        return None

    async def _body(self, request: web.Request) -> bytes:
        coding = _ascii_header(request, CONTENT_ENCODING).lower()
        if coding not in CODINGS:
            # aiohttp hands a body in any other coding over as it came: it would be read as if not encoded.
            raise InvalidArgument(
                CONTENT_ENCODING,
                f"{coding!r} is not a coding the bridge decodes (it takes {', '.join(sorted(CODINGS - {''}))})",
            )
        announced = request.content_length
        if coding in ("", "identity") and announced is not None and announced > self.max_body_bytes:
            # Said up front: answered now, rather than after reading up to the limit of a body that a
            # client may send a byte a second.
            raise _too_large(self.max_body_bytes, announced)
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise InvalidArgument("", f"request body is larger than {self.max_body_bytes} bytes") from None
        except web.RequestPayloadError as exc:
            if isinstance(exc.__cause__, ContentEncodingError):
                raise InvalidArgument(
                    CONTENT_ENCODING, f"the request body could not be decoded as {coding}, as its Content-Encoding says"
                ) from None
            raise

    async def _request_messages(self, route: Route, request: web.Request) -> list[Message]:
        """The messages of a client-streaming call: the body's JSON objects, one message each, all read
        (and checked, before anything is called) up front. A field is named ``requests[i].field``."""
        raw = await self._body(request)
        if len(raw) > OFF_LOOP_BYTES:
            return await asyncio.to_thread(self._parse_messages, route, raw)
        return self._parse_messages(route, raw)

    def _parse_messages(self, route: Route, raw: bytes) -> list[Message]:
        """:meth:`_request_messages` once the body is read (on a worker thread for a large one)."""
        cls = self._request_type(route)
        messages = []
        for i, value in enumerate(protojson.loads_many(raw)):
            if not isinstance(value, dict):
                raise InvalidArgument(f"requests[{i}]", "must be a JSON object")
            message = cls()
            try:
                protojson.to_message(value, message, self.limits.max_payload_bytes)
            except InvalidArgument as exc:
                raise InvalidArgument(f"requests[{i}].{exc.field}".rstrip("."), exc.rule) from None
            messages.append(message)
        return messages

    async def _request_message(self, route: Route, params: dict[str, str], request: web.Request) -> Message:
        message = self._request_type(route)()
        if route.body:
            raw = await self._body(request)
            if len(raw) > OFF_LOOP_BYTES:
                await asyncio.to_thread(self._parse_body, route, raw, message)  # nothing else holds message yet
            else:
                self._parse_body(route, raw, message)
        query = request.rel_url.query
        if query:
            protojson.check_query_text(request.rel_url.raw_query_string)
            fields = route.query_fields()
            protojson.to_message(protojson.query_to_json(query.items(), fields, route.method.input_type.name), message)
        if params:
            _check_path_agrees(message, params)
            protojson.to_message(_nest(params), message)
        return message

    def _parse_body(self, route: Route, raw: bytes, message: Message) -> None:
        """Merge the body ``raw`` into ``message`` (on a worker thread for a large one)."""
        if not raw.strip():
            return
        value = protojson.loads(raw)
        if route.body == "*":
            if not isinstance(value, dict):
                raise InvalidArgument("", "request body must be a JSON object")
            protojson.to_message(value, message, self.limits.max_payload_bytes)
        else:
            protojson.to_message({route.body: value}, message, self.limits.max_payload_bytes)

    async def _stream(
        self, request: web.Request, route: Route, message: Message | AsyncIterator[Message], metadata: Metadata
    ) -> web.StreamResponse:
        resp: web.StreamResponse | None = None
        stream = self.invoker.stream(route, message, metadata)
        try:
            async for item in stream:
                if resp is None:
                    resp = web.StreamResponse(status=200, headers={"Content-Type": NDJSON})
                    await resp.prepare(request)
                await resp.write(await _encoded(item, "result") + b"\n")
        except RpcFailure as failure:
            chunk = protojson.dumps({"error": failure.to_json()}) + b"\n"
            if resp is None:  # nothing sent yet: the error's own HTTP status, as grpc-gateway does
                out = web.Response(status=failure.http_status, body=chunk, content_type=JSON)
                out.headers.update(failure.headers())
                return out
            await resp.write(chunk)
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        if resp is None:
            resp = web.StreamResponse(status=200, headers={"Content-Type": NDJSON})
            await resp.prepare(request)
        await resp.write_eof()
        return resp


async def _encoded(message: Message, under: str = "") -> bytes:
    """The protojson of ``message`` (as ``{under: ...}`` when given), made on a worker thread when it is large."""

    def encode() -> bytes:
        value = protojson.to_json(message)
        return protojson.dumps({under: value} if under else value)

    if message.ByteSize() > OFF_LOOP_BYTES:
        return await asyncio.to_thread(encode)
    return encode()


async def _each(messages: list[Message]) -> AsyncIterator[Message]:
    for message in messages:
        yield message


async def _shielded(call: Coroutine[Any, Any, Message]) -> Message:
    task = asyncio.ensure_future(call)
    task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved even if nobody waits
    return await asyncio.shield(task)


def _check_path_agrees(message: Message, params: dict[str, str]) -> None:
    """Refuse a body that sets a field the path sets too, to another value: ``POST /v1/jobs/a:cancel``
    with ``{"id": "b"}`` cancelled ``a`` and said nothing of ``b``. The same value twice is taken."""
    for path, value in params.items():
        target: Any = message
        *heads, last = path.split(".")
        for head in heads:
            if not target.HasField(head):
                break
            target = getattr(target, head)
        else:
            given = getattr(target, last)
            if given and str(given) != value:
                raise InvalidArgument(
                    path, f"is {value!r} in the path and {given!r} in the body: give it once, or the same in both"
                )


def _nest(params: dict[str, str]) -> dict[str, Any]:
    """Path variables as a JSON object (``a.b`` -> ``{"a": {"b": ...}}``)."""
    out: dict[str, Any] = {}
    for path, value in params.items():
        *heads, last = path.split(".")
        target = out
        for head in heads:
            target = target.setdefault(head, {})
        target[last] = value
    return out


def loopback_bind(host: str) -> bool:
    """Whether a server bound to ``host`` (CORRAL_HOST) is reached from this machine only: an address in
    127.0.0.0/8, ``::1`` (bracketed or not) or ``localhost``. A wildcard (``""``, ``0.0.0.0``, ``::``),
    another address or another name is not."""
    name = host.strip().removeprefix("[").removesuffix("]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _authority(value: str) -> tuple[str, int | None] | None:
    """The host (lower case, IPv6 without brackets) and the port (None: not given) of a ``Host`` header's
    value; None when it is not a host and port."""
    try:
        parts = urlsplit(f"//{value}")
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is not a number, a bracket not closed
        return None
    if not host or parts.path or parts.query or parts.fragment or "@" in parts.netloc:
        return None
    return host, port


def _loopback_name(host: str) -> bool:
    """A loopback IP literal, ``localhost`` or a ``*.localhost`` name (RFC 6761: they never leave the
    machine, so no one else's DNS can make them point here); a final dot is taken."""
    name = host.removesuffix(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or bool(mapped and mapped.is_loopback)


def _not_loopback(hosts: Iterable[str]) -> str | None:
    """Why a request with these ``Host`` headers is refused on a loopback bind; None when it is not. A
    request with none (HTTP/1.0) is taken: browsers always send one."""
    values = list(hosts)
    if not values:
        return None
    if len(values) > 1:
        return f"the request has {len(values)} Host headers: which server it is meant for cannot be told"
    authority = _authority(values[0])
    if authority is not None and _loopback_name(authority[0]):
        return None
    return (
        f"Host {values[0][:100]!r} is not a loopback name: this control plane listens on a loopback address "
        "(CORRAL_HOST) and answers only requests for 127.0.0.0/8, ::1, localhost or *.localhost, so that a web "
        "page on a name made to resolve here (DNS rebinding) cannot read it"
    )


def _foreign_origin(method: str, origins: Iterable[str], hosts: Iterable[str], scheme: str) -> str | None:
    """Why a ``method`` request whose ``Origin`` headers are ``origins`` is refused as cross-site; None when
    it has no Origin or its origin is this server: ``scheme`` and the host and port of its one ``Host``."""
    values, host_values = list(origins), list(hosts)
    if not values:
        return None
    refused = "cross-site request refused: "
    unaffected = "; requests without an Origin header (curl, scripts, client libraries) are not affected"
    if len(values) > 1:
        return f"{refused}the request has {len(values)} Origin headers{unaffected}"
    origin = values[0].strip()
    if origin == "null":
        return (
            f"{refused}its Origin is null (a sandboxed page, a local file or a redirect from another site), "
            f"which cannot be told to be this server{unaffected}"
        )
    server = _authority(host_values[0]) if len(host_values) == 1 else None
    if server is not None:
        host, port = server
        if _origin_of(origin) == (scheme, host, port or _DEFAULT_PORTS[scheme]):
            return None
        named = f"this server ({scheme}://{host_values[0][:100]})"
    else:
        named = "this server, whose Host header is missing or unreadable"
    return (
        f"{refused}its Origin {origin[:100]!r} is not {named}, and a web page of another site may not have "
        f"the browser send a {method} here{unaffected}"
    )


def _origin_of(origin: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` of an ``Origin`` value (``scheme://host[:port]``, as browsers send it)."""
    try:
        parts = urlsplit(origin)
        scheme, host, port = parts.scheme.lower(), parts.hostname, parts.port
    except ValueError:
        return None
    if scheme not in _DEFAULT_PORTS or not host or parts.path or parts.query or parts.fragment or "@" in parts.netloc:
        return None
    return scheme, host, port or _DEFAULT_PORTS[scheme]


def _peer(request: web.Request) -> str:
    """The caller's address as gRPC names a peer (``ipv4:127.0.0.1``, ``ipv6:[::1]``), port left out."""
    host = request.remote or "unknown"
    return f"ipv6:[{host}]" if ":" in host else f"ipv4:{host}"


def _method_not_allowed(allowed: Iterable[str]) -> web.Response:
    resp = _json(405, RpcFailure(grpc.StatusCode.UNIMPLEMENTED, "Method Not Allowed").to_json())
    resp.headers["Allow"] = ", ".join(allowed)
    return resp


def _too_large(limit: int, announced: int) -> InvalidArgument:
    return InvalidArgument("", f"request body is larger than {limit} bytes (Content-Length {announced})")


def _request_id(request: web.Request) -> str:
    rid = request.get(RID)
    if rid is None:
        rid = request[RID] = request_id(request.headers.get(REQUEST_ID_HEADER))
    return rid


def _ascii_header(request: web.Request, name: str) -> str:
    values = request.headers.getall(name, ())
    if len(values) > 1:  # which one the client meant cannot be told: a replayed POST must not guess
        raise InvalidArgument(name, f"must be given once, got {len(values)}")
    value = values[0] if values else ""
    if value and not all(" " <= c <= "~" for c in value):
        raise InvalidArgument(name, "must be printable ASCII")
    return value


def _idempotency_key(request: web.Request) -> str:
    for name in (IDEMPOTENCY_HEADER, IDEMPOTENCY_HEADER_X):
        if name in request.headers and _sf_string(_ascii_header(request, name), name) == "":
            # Sent empty, it would make a job with no key: one that a retry of this request makes again.
            raise InvalidArgument(name, "is empty: give a key, or leave the header out for a job with none")
    key = _sf_string(_ascii_header(request, IDEMPOTENCY_HEADER), IDEMPOTENCY_HEADER)
    older = _ascii_header(request, IDEMPOTENCY_HEADER_X)
    if key and older and key != older:
        raise InvalidArgument(IDEMPOTENCY_HEADER, f"differs from {IDEMPOTENCY_HEADER_X} ({key!r} and {older!r})")
    return key or older


def _sf_string(value: str, name: str) -> str:
    """The text of an RFC 8941 string (``"a \\"b\\""``); a value without quotes is taken as it is."""
    if not value.startswith('"'):
        return value
    out: list[str] = []
    chars = iter(value[1:])
    for c in chars:
        if c == "\\":
            c = next(chars, "")
            if c not in ('"', "\\"):
                raise InvalidArgument(name, 'a quoted key may escape only " and \\ (RFC 8941)')
        elif c == '"':
            if next(chars, None) is not None:
                raise InvalidArgument(name, "has text after its closing quote")
            return "".join(out)
        out.append(c)
    raise InvalidArgument(name, "has no closing quote")


def _metadata(request: web.Request) -> Metadata:
    metadata = [(REQUEST_ID, _request_id(request))]
    key = _idempotency_key(request)
    if key:
        metadata.append(("idempotency-key", key))
    auth = _ascii_header(request, "Authorization")
    if auth:
        metadata.append(("authorization", auth))
    return tuple(metadata)


def _json(status: int, value: Any) -> web.Response:
    return web.Response(status=status, body=protojson.dumps(value), content_type=JSON)


def _unauthorized(err: Unauthenticated, had_credentials: bool) -> web.Response:
    """401 with the Status JSON and the RFC 6750 challenge (``invalid_token`` when a token was refused)."""
    resp = _failure(RpcFailure.from_error(err))
    challenge = 'Bearer realm="corral"'
    resp.headers["WWW-Authenticate"] = challenge + (', error="invalid_token"' if had_credentials else "")
    return resp


def _failure(failure: RpcFailure) -> web.Response:
    resp = _json(failure.http_status, failure.to_json())
    resp.headers.update(failure.headers())
    return resp
