"""Connections that say nothing, or next to nothing, are closed: a client cannot hold the control plane's
file descriptors with TCP connections that say nothing.

gRPC: before, 20,000 connections that never finished their handshake were all held (gRPC's default
handshake timeout is 120 s, and it started again for each new one), up to the process's descriptor
limit, and a worker that had to reconnect then could not.

HTTP: before, the REST port held a connection whose request's headers, or body, stopped coming, or came
a byte every few seconds, for as long as the client liked (slowloris), and had no cap on connections.
Now a request's headers must be in CORRAL_HTTP_HEADER_TIMEOUT_SEC after the connection opened or the
response before was sent, its body may not go CORRAL_HTTP_BODY_TIMEOUT_SEC without a byte, and past
CORRAL_HTTP_MAX_CONNECTIONS a connection is answered 503 and closed; what the client is sent (a watch
stream) takes as long as it takes."""

from __future__ import annotations

import http.client
import json
import select
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from control.api import HANDSHAKE_TIMEOUT_SEC
from corral.v1 import jobs_pb2
from tests.conftest import FAST_ENV, ControlProc, wait_until
from tests.support.calls import submit
from tests.support.certs import make_pki

SILENT = 20
DEADLINE = 1.0
"""CORRAL_HTTP_HEADER_TIMEOUT_SEC of the HTTP tests' control plane."""
BODY_DEADLINE = 2.0
"""Its CORRAL_HTTP_BODY_TIMEOUT_SEC: well over DRIBBLE_EVERY, so that a loaded machine that holds the
test's thread back a while does not make a steady client look silent."""
PATIENCE = BODY_DEADLINE + 15
"""How long a connection that the control plane should close is waited for (a hang guard, not a bound)."""
EARLY = 0.05
"""Timers' granularity: a connection closed this much before its deadline is closed in time."""
DRIBBLE_EVERY = 0.3
"""Seconds between two bytes of a client that dribbles."""
DEADLINES = {"CORRAL_HTTP_HEADER_TIMEOUT_SEC": str(DEADLINE), "CORRAL_HTTP_BODY_TIMEOUT_SEC": str(BODY_DEADLINE)}
SUBMIT = json.dumps({"type": "noop"}).encode()


def _closed(sock: socket.socket) -> bool:
    """Whether the peer closed ``sock`` (read without waiting)."""
    try:
        return sock.recv(1 << 16, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _tls_closed(sock: ssl.SSLSocket) -> bool:
    """Whether the peer closed ``sock``, a non-blocking TLS socket (which takes no MSG_DONTWAIT)."""
    try:
        return sock.recv(1 << 16) == b""
    except ssl.SSLWantReadError:
        return False
    except OSError:
        return True


@pytest.mark.slow
def test_connections_that_never_finish_their_handshake_are_closed(control_plane: ControlProc) -> None:
    # Given connections to the gRPC port that send nothing at all
    socks = [socket.create_connection(("127.0.0.1", control_plane.port)) for _ in range(SILENT)]
    opened = time.monotonic()
    try:
        # Then the control plane closes each of them once the handshake timeout has passed
        wait_until(
            lambda: all(_closed(s) for s in socks), HANDSHAKE_TIMEOUT_SEC + 10, 0.2, "the silent connections closed"
        )
        assert time.monotonic() - opened >= HANDSHAKE_TIMEOUT_SEC - 1  # not before: a slow TLS client gets its time
        # and it goes on serving
        assert control_plane.jobs.GetStats(jobs_pb2.GetStatsRequest(), timeout=10) is not None
    finally:
        for s in socks:
            s.close()


# ---- HTTP ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlProc]:
    """A control plane with short HTTP deadlines and no workers, shared by the module's HTTP tests."""
    cp = ControlProc(tmp_path_factory.mktemp("strict-http"), {**FAST_ENV, **DEADLINES})
    try:
        cp.start()
        yield cp
    finally:
        cp.close()


@pytest.fixture
def connect(strict: ControlProc) -> Iterator[Callable[[], socket.socket]]:
    """Opens blocking sockets to ``strict``'s HTTP port (:func:`_closed` needs them blocking), closed after."""
    opened: list[socket.socket] = []

    def make() -> socket.socket:
        opened.append(socket.create_connection(("127.0.0.1", strict.http_port)))
        return opened[-1]

    yield make
    for sock in opened:
        sock.close()


def _head(method: str, path: str, *headers: str) -> bytes:
    return "".join(f"{line}\r\n" for line in (f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *headers, "")).encode()


def _get(port: int, path: str) -> tuple[int, Any]:
    """A GET on a new connection: the status and the JSON body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def _answer(sock: socket.socket) -> http.client.HTTPResponse:
    """The response that comes on ``sock`` (waited for up to PATIENCE)."""
    sock.settimeout(PATIENCE)
    resp = http.client.HTTPResponse(sock)
    try:
        resp.begin()
    except TimeoutError:
        pytest.fail(f"no response in {PATIENCE} s")
    return resp


@pytest.mark.parametrize(
    "sent",
    [b"", b"GE", _head("POST", "/v1/jobs", "Content-Type: application/json")[:-2]],
    ids=["nothing", "part of the request line", "all but the end of the headers"],
)
def test_a_connection_whose_request_headers_stop_coming_is_closed_at_the_deadline(
    connect: Callable[[], socket.socket], sent: bytes
) -> None:
    # Given a connection that sends part of a request (or nothing) and then nothing more
    opened = time.monotonic()
    sock = connect()
    sock.sendall(sent)
    # Then the control plane closes it once the header deadline has passed, and not before
    wait_until(lambda: _closed(sock), PATIENCE, 0.02, "the stalled connection to be closed")
    assert time.monotonic() - opened >= DEADLINE - EARLY


def test_headers_that_come_a_byte_at_a_time_are_closed_at_the_deadline(connect: Callable[[], socket.socket]) -> None:
    # Given a connection that sends a request's headers a byte every 0.3 s (a header that never ends)
    opened = time.monotonic()
    sock = connect()
    sock.sendall(_head("GET", "/healthz")[:-2] + b"X-Slow: ")
    dribbled = 0
    # (select both paces the bytes and sees the close)
    while not select.select([sock], [], [], DRIBBLE_EVERY)[0]:
        if time.monotonic() - opened > PATIENCE:
            pytest.fail(f"a connection dribbling its headers is still open after {PATIENCE} s ({dribbled} bytes)")
        try:
            sock.send(b"a")
        except OSError:
            break
        dribbled += 1
    # Then bytes that keep coming do not put the deadline off: it is closed once the deadline has passed
    assert _closed(sock)
    assert time.monotonic() - opened >= DEADLINE - EARLY
    assert dribbled >= int(DEADLINE / DRIBBLE_EVERY)  # it was sending until then


def test_a_body_that_stops_coming_is_closed_and_one_that_keeps_coming_is_taken(
    strict: ControlProc, connect: Callable[[], socket.socket]
) -> None:
    head = _head("POST", "/v1/jobs", "Content-Type: application/json", f"Content-Length: {len(SUBMIT)}")
    # Given a submission whose body stops after 3 bytes
    stalled = connect()
    stalled_at = time.monotonic()
    stalled.sendall(head + SUBMIT[:3])
    stalled_closed_at = None
    # and one whose body comes a byte every 0.3 s (16 bytes: 4.8 s, past the deadline)
    dribbling = connect()
    dribbling.sendall(head)
    for byte in SUBMIT:
        if select.select([dribbling], [], [], DRIBBLE_EVERY)[0]:
            pytest.fail(f"the connection dribbling its body was closed or answered early: {dribbling.recv(1024)!r}")
        dribbling.send(bytes([byte]))
        if stalled_closed_at is None and _closed(stalled):
            stalled_closed_at = time.monotonic()
    # Then the stalled one is closed once its body has been silent for the body deadline, and not before
    if stalled_closed_at is None:
        wait_until(lambda: _closed(stalled), PATIENCE, 0.02, "the connection whose body stopped to be closed")
        stalled_closed_at = time.monotonic()
    assert stalled_closed_at - stalled_at >= BODY_DEADLINE - EARLY
    # and the one that kept sending is answered: the deadline is between two bytes, not on the whole body
    resp = _answer(dribbling)
    assert resp.status == 200, resp.read()
    assert json.loads(resp.read())["job"]["type"] == "noop"


def test_a_watch_stream_outlives_the_deadline_and_its_connection_is_closed_once_idle_after_it(
    strict: ControlProc, connect: Callable[[], socket.socket]
) -> None:
    # Given a REST watch of a job that waits (no workers)
    job = submit(strict, "noop")
    conn = http.client.HTTPConnection("127.0.0.1", strict.http_port)  # blocking: _closed reads its socket
    try:
        conn.request("GET", f"/v1/jobs/{job.id}:watch")
        stream = conn.getresponse()
        assert stream.status == 200
        assert json.loads(stream.readline())["result"]["job"]["state"] == "PENDING"
        # When the watch goes on, saying nothing, past the deadline (a silent connection opened now is
        # closed meanwhile)
        silent = connect()
        wait_until(lambda: _closed(silent), PATIENCE, 0.02, "the silent connection to be closed")
        # and the job is then cancelled
        cancelled_at = time.monotonic()
        strict.jobs.CancelJob(jobs_pb2.CancelJobRequest(id=job.id), timeout=10)
        # Then the stream brings the cancellation and ends as usual: what the client is sent has no deadline
        events = [json.loads(line)["result"]["job"]["state"] for line in stream.read().splitlines()]
        assert events[-1] == "CANCELLED"
        assert not stream.will_close and conn.sock is not None  # kept alive
        # and the connection, idle after it, is closed one deadline after the stream ended, not before
        sock = conn.sock
        wait_until(lambda: _closed(sock), PATIENCE, 0.02, "the idle kept-alive connection to be closed")
        assert time.monotonic() - cancelled_at >= DEADLINE - EARLY
    finally:
        conn.close()


def test_three_hundred_stalled_connections_are_all_closed_and_the_port_answers_meanwhile(
    strict: ControlProc, connect: Callable[[], socket.socket]
) -> None:
    # Given 300 connections, half of them silent, half with a request's headers half sent
    opened = time.monotonic()
    socks = [connect() for _ in range(300)]
    for sock in socks[::2]:
        sock.sendall(_head("GET", "/v1/stats")[:-2])
    # Then a request on a new connection is answered meanwhile
    assert _get(strict.http_port, "/healthz") == (200, {"status": "SERVING"})
    # and every one of them is closed once the deadline has passed
    wait_until(lambda: all(_closed(s) for s in socks), PATIENCE, 0.05, "the 300 stalled connections to be closed")
    assert time.monotonic() - opened >= DEADLINE - EARLY
    # and the port goes on answering
    assert _get(strict.http_port, "/v1/stats")[0] == 200


def test_a_connection_over_the_cap_is_answered_503_and_closed(make_control_plane: Callable[..., ControlProc]) -> None:
    cp = make_control_plane(CORRAL_HTTP_MAX_CONNECTIONS=20, **DEADLINES)
    socks = []
    try:
        # Given as many connections as the cap, saying nothing
        socks = [socket.create_connection(("127.0.0.1", cp.http_port)) for _ in range(20)]
        # When one more comes
        extra = socket.create_connection(("127.0.0.1", cp.http_port))
        socks.append(extra)
        # Then it is told 503 (a google.rpc.Status, UNAVAILABLE, and when to come back) and closed
        resp = _answer(extra)
        assert (resp.status, resp.getheader("Retry-After"), resp.getheader("Connection")) == (503, "1", "close")
        body = json.loads(resp.read())
        assert body["code"] == 14 and "too many HTTP connections" in body["message"], body
        assert [e["limit"] for e in cp.events("http_connections_full")] == [20]
        # and once the silent ones are closed (the header deadline), the port answers again
        wait_until(lambda: all(_closed(s) for s in socks[:20]), PATIENCE, 0.05, "the silent connections to be closed")
        assert _get(cp.http_port, "/healthz") == (200, {"status": "SERVING"})
    finally:
        for sock in socks:
            sock.close()


def test_over_https_a_stalled_handshake_and_stalled_headers_are_closed(
    make_control_plane: Callable[..., ControlProc], tmp_path: Path
) -> None:
    pki = make_pki(tmp_path / "pki")
    cp = make_control_plane(CORRAL_TLS_CERT=str(pki.server_cert), CORRAL_TLS_KEY=str(pki.server_key), **DEADLINES)
    context = ssl.create_default_context(cafile=str(pki.ca))
    # Given a connection that never begins its TLS handshake (asyncio would give it 60 s)
    opened = time.monotonic()
    silent = socket.create_connection(("127.0.0.1", cp.http_port))
    # and one that completes it, then sends half a request's headers
    tls = context.wrap_socket(socket.create_connection(("127.0.0.1", cp.http_port)), server_hostname="127.0.0.1")
    try:
        tls.sendall(_head("GET", "/healthz")[:-2])
        tls.setblocking(False)
        # Then both are closed once the deadline has passed, and not before
        wait_until(lambda: _closed(silent), PATIENCE, 0.02, "the connection that never began its handshake")
        wait_until(lambda: _tls_closed(tls), PATIENCE, 0.02, "the TLS connection whose headers stalled")
        assert time.monotonic() - opened >= DEADLINE - EARLY
        # and HTTPS requests are answered
        conn = http.client.HTTPSConnection("127.0.0.1", cp.http_port, context=context, timeout=30)
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        silent.close()
        tls.close()
