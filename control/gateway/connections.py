"""What a client may hold of the HTTP port: deadlines on what it sends, and a cap on connections.

aiohttp's server gives a client as long as it likes to send a request's headers (its keep-alive timer
aside, an hour by default) and its body, so a client that sends nothing, or a byte every few seconds,
holds its connection, and one of the process's file descriptors, for as long as it likes; a thousand
such clients hold a thousand (slowloris). So, on each connection:

* **Headers.** A request's line and headers must be all in ``header_timeout_sec`` after the connection
  opened, or after the response before it on a kept-alive connection (so an idle kept-alive connection
  is closed too, as nginx's ``client_header_timeout`` and ``keepalive_timeout`` do). Bytes that trickle
  in do not put the deadline off. With HTTPS, the TLS handshake has a deadline as long, of its own.
* **Body.** Until a request's body is all in, it may go ``body_timeout_sec`` without a byte (nginx's
  ``client_body_timeout``). A pause of the server's own making, its buffer full of a body that the
  handler has not read yet, does not count.
* **Nothing else.** Once the body is in, the connection stays as long as the answer takes: a WatchJob
  stream for hours, a large response to a client that reads it slowly. The deadlines are on what the
  client sends, never on what it is sent.
* **Connections.** At most ``max_connections`` are open at once, so that REST clients cannot take the
  descriptors that workers need to reconnect over gRPC. Past the cap, :data:`PROBE_RESERVE` more are
  taken for probes only: such a connection is served ``/healthz``, ``/readyz``, ``/health``, ``/ready``
  and ``/metrics`` (:data:`PROBE_PATHS`), one request and then closed; anything else, or no request in
  :data:`PROBE_HEADER_SEC`, is answered 503 (a ``google.rpc.Status`` JSON, ``Retry-After: 1``) and
  closed. So long watch streams that hold every connection do not make a liveness probe restart a
  healthy control plane. Once the reserve is taken too, a connection is answered that 503 at once and
  closed, before it is read.

A request the HTTP parser cannot read (a header over 8 KiB, too many headers, a Content-Length that is
not a number) is answered 400 as the bridge answers errors, and logged as one warning a minute at most
(:class:`Throttled`), with no traceback: any client can send one at will.

A connection past a deadline is aborted (closed with a reset), so its descriptor is free at once, where
a graceful close would first wait for the client to read what is left to send. Nothing is lost by it
but such a leftover: the client owed a request, or the rest of one.

How: :class:`GuardedSite` listens as aiohttp's ``TCPSite`` does, but each connection's protocol is a
:class:`GuardedHandler`: aiohttp's own ``RequestHandler`` with one timer. It learns that a request's
headers are in from :func:`headers_in`, the application's outermost middleware, which aiohttp calls with
the request as soon as the ones before it on the connection are answered, and that the answer is out
from ``finish_response``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import grpc
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMethod, HttpProcessingError
from aiohttp.streams import StreamReader
from aiohttp.typedefs import Handler

from control.api.interceptors import request_id
from control.gateway import protojson
from control.gateway.status import RpcFailure
from corral.open_files import HTTP_PROBE_RESERVE

if TYPE_CHECKING:
    import ssl

    from control.config import ControlConfig

logger = logging.getLogger(__name__)

HANDLER_ARGS: dict[str, Any] = {"access_log": None}
"""What aiohttp's request handlers are made with, by the runner and by :class:`GuardedSite` alike: no
access log (the gateway counts requests in its metrics)."""

PROBE_RESERVE = HTTP_PROBE_RESERVE
"""Connections past the cap that may be opened for :data:`PROBE_PATHS` only (the control plane fits the
cap and these to its open-file limit: :func:`corral.open_files.fitted_http_connections`)."""
PROBE_HEADER_SEC = 1.0
"""How long a connection of the reserve may take to send its request's headers (a probe sends them at
once), when CORRAL_HTTP_HEADER_TIMEOUT_SEC is longer: the reserve is small, and the client told to retry."""
PROBE_PATHS = frozenset({"/healthz", "/readyz", "/health", "/ready", "/metrics"})
"""What a connection of the reserve is served: liveness, readiness and metrics."""

FULL_WARNING_EVERY_SEC = 60.0
"""A flood of refused connections is logged once a minute at most, with how many were refused."""
NO_STORE = {"Cache-Control": "no-store"}
"""On every answer of the bridge, its errors too: a response may hold a token, a payload or a result."""


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """The deadlines and the cap (the module docstring says what each bounds)."""

    header_timeout_sec: float = 10.0
    """CORRAL_HTTP_HEADER_TIMEOUT_SEC."""
    body_timeout_sec: float = 10.0
    """CORRAL_HTTP_BODY_TIMEOUT_SEC."""
    max_connections: int = 1000
    """CORRAL_HTTP_MAX_CONNECTIONS; 0: no cap."""
    max_payload_bytes: int = field(default=0, compare=False)
    """CORRAL_MAX_PAYLOAD_BYTES: a body whose payload is surely longer as JSON is refused before it is
    converted (control.gateway.protojson.to_message); 0: left to the services. Not compared: it bounds
    what a request holds, not what a client may hold of the port."""

    @classmethod
    def from_config(cls, config: ControlConfig) -> HttpLimits:
        """The limits a control plane's configuration sets."""
        return cls(
            config.http_header_timeout_sec,
            config.http_body_timeout_sec,
            config.http_max_connections,
            config.max_payload_bytes,
        )


UNREADABLE_EVENT = "http_request_unreadable"
"""The log event of a request the HTTP parser refused (a header over 8 KiB, too many headers, ...)."""

REQUEST_ID_HEADER = "X-Request-ID"
"""The header that carries a request's id, given (``control.api.interceptors.request_id``) or made."""

FULL_FAILURE = RpcFailure(grpc.StatusCode.UNAVAILABLE, "too many HTTP connections are open; try again")


def _unreadable(status: int, exc: BaseException | None, message: str | None) -> str:
    """What :meth:`GuardedHandler.handle_error` says: the first line of aiohttp's reason, never the
    client's bytes that it quotes after it, and no advice about the server's libraries."""
    if status >= 500:
        return "internal error while reading the request"
    reason = getattr(exc, "message", None) or message or str(exc or "")
    first = str(reason).strip().splitlines()[0] if str(reason).strip() else "malformed request"
    if "content-encoding" in first.lower():
        return "Content-Encoding: cannot be decoded here; send the body as gzip, deflate or not encoded"
    said = re.split(r"""b?['"]""", first, maxsplit=1)[0].rstrip(" :(")  # what follows quotes the client's bytes
    return f"the request could not be read as HTTP: {said[:200] or 'malformed request'}"


def _full_answer() -> bytes:
    failure = FULL_FAILURE
    body = protojson.dumps(failure.to_json())
    head = (
        f"HTTP/1.1 {failure.http_status} Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class Throttled:
    """An event that any client can cause at will (a request refused before it is served): logged as a
    warning once every ``every_sec`` at most, with how many times it happened since the last warning
    (``times``, this one included); the times in between at debug level. So a flood of such requests
    is one line a minute, and no traceback, rather than an error-level entry for each."""

    def __init__(self, event: str, log: logging.Logger, every_sec: float = FULL_WARNING_EVERY_SEC) -> None:
        self.event = event
        self.log = log
        self.every_sec = every_sec
        self._times = 0
        self._warn_after = 0.0

    def __call__(self, **extra: Any) -> None:
        """One more time, with what to say of it (``extra``: the log line's fields)."""
        self._times += 1
        now = time.monotonic()
        if now < self._warn_after:
            self.log.debug(self.event, extra=extra)
            return
        self._warn_after = now + self.every_sec
        self.log.warning(self.event, extra={**extra, "times": self._times})
        self._times = 0


class Admission:
    """Counts the site's open connections against the cap, and those of the probes' reserve past it."""

    def __init__(self, limit: int, reserve: int = PROBE_RESERVE) -> None:
        self.limit = limit
        """0: no cap."""
        self.reserve = reserve
        self.open = 0
        self.probes = 0
        """Connections open in the reserve."""
        self._refused = 0
        self._warn_after = 0.0

    def admit(self) -> bool | None:
        """Count one more connection: True, admitted; None, admitted for probes only (the cap is reached);
        False, refused (the reserve is taken too), and logged now and then."""
        if not self.limit or self.open < self.limit:
            self.open += 1
            return True
        if self.probes < self.reserve:
            self.probes += 1
            return None
        self.refused()
        return False

    def refused(self) -> None:
        """One connection is turned away for the cap (logged once a minute at most, with how many)."""
        self._refused += 1
        now = time.monotonic()
        if now >= self._warn_after:
            self._warn_after = now + FULL_WARNING_EVERY_SEC
            logger.warning("http_connections_full", extra={"limit": self.limit, "refused": self._refused})
            self._refused = 0

    def release(self, probes_only: bool = False) -> None:
        """One admitted connection is gone (``probes_only``: one of the reserve)."""
        if probes_only:
            self.probes -= 1
        else:
            self.open -= 1


class GuardedHandler(web.RequestHandler):
    """aiohttp's request handler (the protocol of one connection), with the deadlines and the cap."""

    __slots__ = (
        "_admission",
        "_admitted",
        "_answering",
        "_deadline",
        "_held_by_us",
        "_idle_since",
        "_last_byte_at",
        "_limits",
        "_owed_body",
        "_unreadable_log",
        "probes_only",
    )

    FULL = _full_answer()
    """What a connection over the cap is told before it is closed."""

    def __init__(
        self,
        manager: web.Server,
        *,
        loop: asyncio.AbstractEventLoop,
        limits: HttpLimits,
        admission: Admission,
        unreadable_log: Throttled | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(manager, loop=loop, **kwargs)
        self._limits = limits
        self._admission = admission
        self._unreadable_log = unreadable_log or Throttled(UNREADABLE_EVENT, logger)
        """Logs the requests that could not be read (shared by the site's connections)."""
        self._admitted = False
        self.probes_only = False
        """Admitted in the probes' reserve: :data:`PROBE_PATHS` only, one request (see :func:`headers_in`)."""
        self._deadline: asyncio.TimerHandle | None = None
        self._answering = False
        """From a request's headers being in (:meth:`request_started`) to the end of its response."""
        self._owed_body: StreamReader | None = None
        """The body of the request being answered, while the client may still owe some of it."""
        self._last_byte_at = 0.0
        self._idle_since = 0.0
        """Since when the connection waits for a request's headers."""
        self._held_by_us = False
        """Reading is paused by flow control: the client may not send, so its silence does not count."""

    # ---- the connection ---------------------------------------------------------------------------
    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's own answer to a request it could not read (a header or a URL too long, a Content-Length
        that is not a number, a Content-Encoding it cannot undo, bytes that are not HTTP), made as the bridge
        answers every failed call: a ``google.rpc.Status`` JSON with an ``X-Request-ID``. aiohttp's text
        echoed the client's bytes back and, for an encoding whose library is missing, told the client what
        to install on the server.

        Logging: a request the parser refused (a 4xx: any client can send one at will) is the
        ``http_request_unreadable`` warning, once a minute at most (:class:`Throttled`), without a
        traceback or the client's bytes; bytes that are not HTTP at all are at debug level, as aiohttp
        has them. aiohttp logged each of them at error level with the parser's traceback. A server
        error (5xx: a handler that failed) is logged by aiohttp as before, with its traceback."""
        said = _unreadable(status, exc, message)
        if status >= 500 or not isinstance(exc, HttpProcessingError | None):
            super().handle_error(request, status, exc, message)  # logs it; raises when an answer is under way
        else:
            if isinstance(exc, BadHttpMethod):  # TLS or a scanner's bytes on the HTTP port
                logger.debug(UNREADABLE_EVENT, extra={"peer": request.remote, "status": status, "reason": said})
            else:
                self._unreadable_log(peer=request.remote, status=status, reason=said)
            if request.writer.output_size > 0:  # as aiohttp's: the connection is broken
                raise ConnectionError("Response is sent already, cannot send another response with the error message")
        code = grpc.StatusCode.INTERNAL if status >= 500 else grpc.StatusCode.INVALID_ARGUMENT
        failure = RpcFailure(code, said)
        response = web.Response(
            status=status,
            body=protojson.dumps(failure.to_json()),
            content_type="application/json",
            headers={REQUEST_ID_HEADER: request_id(None), **NO_STORE},
        )
        response.force_close()
        return response

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Admit the connection and start the deadline for its first request's headers, or turn it away."""
        admitted = self._admission.admit()
        if admitted is False:
            # Turned away before aiohttp sees it: no handler task, not among the server's connections.
            tcp = cast(asyncio.Transport, transport)
            tcp.write(self.FULL)
            tcp.close()
            return
        self._admitted = True
        self.probes_only = admitted is None
        super().connection_made(transport)
        self._waiting_for_headers()

    def connection_lost(self, exc: BaseException | None) -> None:
        """Stop the timer and give the connection's place back."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if not self._admitted:
            return
        self._admitted = False
        self._admission.release(self.probes_only)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Note the time (a body's bytes put its deadline off), then parse as aiohttp does."""
        if not self._admitted:
            return
        self._last_byte_at = self._loop.time()
        super().data_received(data)

    def pause_reading(self) -> None:
        """Flow control holds the body back: the client's silence is ours until :meth:`resume_reading`."""
        self._held_by_us = True
        super().pause_reading()

    def resume_reading(self, resume_parser: bool = True) -> None:
        """The client may send again: its body's silence counts from now."""
        self._held_by_us = False
        self._last_byte_at = self._loop.time()
        super().resume_reading(resume_parser)

    # ---- requests ---------------------------------------------------------------------------------
    def request_started(self, request: web.BaseRequest) -> None:
        """``request``'s headers are all in (:func:`headers_in` says so): its body's deadline starts."""
        self._answering = True
        body = request.content
        if body.is_eof():
            self._owed_body = None
            return
        self._owed_body = body
        self._last_byte_at = self._loop.time()
        self._arm(self._last_byte_at + self._limits.body_timeout_sec)

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        """Send the response as aiohttp does; once it is out, the next request's headers are awaited."""
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self._answering = False
            self._waiting_for_headers()

    def refused(self) -> None:
        """This connection of the probes' reserve is answered 503 (see :func:`headers_in`)."""
        self._admission.refused()

    # ---- the deadline -----------------------------------------------------------------------------
    def _header_timeout(self) -> float:
        timeout = self._limits.header_timeout_sec
        return min(timeout, PROBE_HEADER_SEC) if self.probes_only else timeout

    def _waiting_for_headers(self) -> None:
        self._idle_since = self._loop.time()
        if self.transport is not None:
            self._arm(self._idle_since + self._header_timeout())

    def _arm(self, due: float) -> None:
        timer = self._deadline
        if timer is not None:
            if timer.when() <= due:
                return  # it goes off first, and looks again then
            timer.cancel()
        self._deadline = self._loop.call_at(due, self._check)

    def _check(self) -> None:
        """The timer went off: close the connection if it is past a deadline, else wait for the next one.

        One timer per connection, put back only when it goes off early: a body's every byte moves its
        deadline, and cancelling and making a timer for each would cost more than the rare early check.
        """
        self._deadline = None
        if self.transport is None:
            return
        now = self._loop.time()
        body = self._owed_body
        if body is not None and not body.is_eof():
            if self._held_by_us:
                self._arm(now + self._limits.body_timeout_sec)
                return
            due, owed = self._last_byte_at + self._limits.body_timeout_sec, "body"
        elif self._answering:
            return  # nothing is owed while a request is answered: no deadline on how long that takes
        else:
            due, owed = self._idle_since + self._header_timeout(), "headers"
        if now < due:
            self._arm(due)
            return
        if self.probes_only and owed == "headers":  # over the cap, and no probe: told so, as at the cap
            self._admission.refused()
            self.transport.write(self.FULL)
            self.transport.close()
            return
        logger.debug("http_connection_timed_out", extra={"owed": owed, "peer": self.peername})
        self.transport.abort()


@web.middleware
async def headers_in(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The outermost middleware: tells the connection that ``request``'s headers are all in; on a
    connection of the probes' reserve, serves :data:`PROBE_PATHS` only, and closes it after the answer."""
    protocol = request.protocol
    if isinstance(protocol, GuardedHandler):
        protocol.request_started(request)
        if protocol.probes_only:
            if request.method in ("GET", "HEAD") and request.path in PROBE_PATHS:
                response = await handler(request)
            else:
                protocol.refused()
                response = web.Response(
                    status=FULL_FAILURE.http_status,
                    body=protojson.dumps(FULL_FAILURE.to_json()),
                    content_type="application/json",
                    headers={"Retry-After": "1", **NO_STORE},
                )
            response.force_close()  # one request: the reserve is for probes, which come and go
            return response
    return await handler(request)


class GuardedSite(web.BaseSite):
    """aiohttp's ``TCPSite``, whose connections are :class:`GuardedHandler` s.

    The application must have :func:`headers_in` as its first middleware, or each request's headers
    would count as never in, and its connection would be closed ``header_timeout_sec`` after it opened.
    """

    __slots__ = ("_admission", "_host", "_limits", "_port", "_unreadable_log")

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        limits: HttpLimits,
        *,
        ssl_context: ssl.SSLContext | None = None,
        backlog: int = 128,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._host = host
        self._port = port
        self._limits = limits
        self._admission = Admission(limits.max_connections)
        self._unreadable_log = Throttled(UNREADABLE_EVENT, logger)

    @property
    def name(self) -> str:
        """``http://host:port`` (``https`` with TLS), as aiohttp names its sites."""
        return f"{'https' if self._ssl_context else 'http'}://{self._host or '0.0.0.0'}:{self._port}"

    async def start(self) -> None:
        """Listen on ``host:port``.

        Raises:
            OSError: the address cannot be bound.
        """
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None  # BaseSite refuses a runner that is not set up

        def guarded() -> GuardedHandler:
            return GuardedHandler(
                server,
                loop=loop,
                limits=self._limits,
                admission=self._admission,
                unreadable_log=self._unreadable_log,
                **HANDLER_ARGS,
            )

        tls: dict[str, Any] = {}
        if self._ssl_context is not None:
            # The handshake comes before the protocol has the connection, so the header deadline cannot
            # cover it, and asyncio would give it 60 s.
            tls = {"ssl": self._ssl_context, "ssl_handshake_timeout": self._limits.header_timeout_sec}
        listener = await loop.create_server(guarded, self._host, self._port, backlog=self._backlog, **tls)
        self._server = listener
        if listener.sockets:
            self._port = listener.sockets[0].getsockname()[1]  # the one bound, when 0 was asked for
