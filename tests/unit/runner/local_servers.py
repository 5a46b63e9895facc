"""Real servers on 127.0.0.1 for the network job types: HTTP (http.server) and SMTP (aiosmtpd).

Both bind an ephemeral port on loopback, run in a background thread and record what they received,
so a test can assert on the request a job sent. Use them as context managers.

HTTP routes:

* ``GET /bytes/<n>?seed=<s>``: n bytes of ``random.Random(s).randbytes(n)``;
* ``<ANY> /echo``: 200 and a JSON echo of method, path, headers and body (the request is recorded);
* ``<ANY> /status/<code>``: that status, body ``"status <code>"``;
* ``<ANY> /flaky/<k>``: 503 for the first k requests to that path, then 200 ``"ok"``;
* ``GET /big/<n>``: n bytes of ``"x"``.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support.ports import free_port

__all__ = ["HttpRequestSeen", "LocalHttp", "LocalSmtp", "local_http", "local_smtp"]


@dataclass(frozen=True)
class HttpRequestSeen:
    """One request the HTTP server answered."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class LocalHttp:
    """A running HTTP server: its base URL and the requests it saw."""

    url: str
    requests: list[HttpRequestSeen] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _answer(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        parts = urlsplit(self.path)
        seen = HttpRequestSeen(self.command, parts.path, dict(self.headers.items()), body)
        state = self.server.state
        state.requests.append(seen)
        state.counts[parts.path] = state.counts.get(parts.path, 0) + 1
        route = parts.path.strip("/").split("/")
        if route[0] == "bytes":
            seed = int(parse_qs(parts.query).get("seed", ["0"])[0])
            self._answer(200, random.Random(seed).randbytes(int(route[1])), "application/octet-stream")
        elif route[0] == "echo":
            echo = {"method": seen.method, "path": seen.path, "headers": seen.headers, "body": body.decode()}
            self._answer(200, json.dumps(echo).encode(), "application/json")
        elif route[0] == "status":
            self._answer(int(route[1]), f"status {route[1]}".encode())
        elif route[0] == "flaky":
            if state.counts[parts.path] <= int(route[1]):
                self._answer(503, b"try again later")
            else:
                self._answer(200, b"ok")
        elif route[0] == "big":
            self._answer(200, b"x" * int(route[1]))
        else:
            self._answer(404, b"no such route")

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: LocalHttp


@contextmanager
def local_http() -> Iterator[LocalHttp]:
    """An HTTP server on 127.0.0.1:<ephemeral>, stopped on exit."""
    server = _Server(("127.0.0.1", 0), _Handler)
    server.state = LocalHttp(f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server.state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@dataclass
class LocalSmtp:
    """A running SMTP server: host, port and the messages it accepted (with their envelopes)."""

    host: str
    port: int
    messages: list[tuple[str, list[str], Message]] = field(default_factory=list)
    refuse: set[str] = field(default_factory=set)


@contextmanager
def local_smtp(refuse: set[str] | None = None) -> Iterator[LocalSmtp]:
    """An aiosmtpd server on 127.0.0.1 that keeps every message and refuses ``refuse`` recipients."""
    from aiosmtpd.controller import Controller

    state = LocalSmtp("127.0.0.1", 0, refuse=set(refuse or ()))

    class Handler:
        async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str, options: Any) -> str:
            if address in state.refuse:
                return "550 5.1.1 no such mailbox"
            envelope.rcpt_tos.append(address)
            return "250 OK"

        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
            state.messages.append(
                (
                    envelope.mail_from,
                    list(envelope.rcpt_tos),
                    message_from_bytes(envelope.content, policy=policy.default),
                )
            )
            return "250 Message accepted for delivery"

    for _ in range(5):  # the port may be taken between free_port() and start()
        state.port = free_port()
        controller = Controller(Handler(), hostname="127.0.0.1", port=state.port)
        try:
            controller.start()
        except (OSError, RuntimeError):
            continue
        break
    else:
        raise RuntimeError("could not start the SMTP server")
    try:
        yield state
    finally:
        controller.stop()
