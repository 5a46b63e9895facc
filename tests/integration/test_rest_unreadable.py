"""Requests the HTTP parser cannot read get the bridge's error contract too: a ``google.rpc.Status`` JSON
with an ``X-Request-ID``, naming the problem without echoing the client's bytes or the server's
libraries. Raw requests on a socket to a real control plane."""

from __future__ import annotations

import json
import socket

import pytest

from tests.conftest import ControlProc

SECRET = "s3cr3t-the-answer-must-not-echo"


def _raw(port: int, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``data`` and read the whole answer (the server closes the connection after it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


@pytest.mark.parametrize(
    ("case", "data", "says"),
    [
        (
            "a header over 8 KiB",
            f"GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Foo: {SECRET}{'a' * 9000}\r\n\r\n".encode(),
            "could not be read as HTTP",
        ),
        (
            "a URL over 8 KiB",
            f"GET /v1/jobs/{SECRET}{'a' * 9000} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode(),
            "could not be read as HTTP",
        ),
        (
            "a Content-Length that is not a number",
            b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: abc\r\n\r\n",
            "could not be read as HTTP",
        ),
        (
            "bytes that are not HTTP",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + SECRET.encode() + b"\r\n\r\n",
            "could not be read as HTTP",
        ),
        (
            "an encoding its library is missing for",
            b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Encoding: zstd\r\n"
            b'Content-Length: 16\r\n\r\n{"type": "noop"}',
            "Content-Encoding: cannot be decoded here",
        ),
    ],
)
def test_an_unreadable_request_gets_a_status_json_with_a_request_id(
    control_plane: ControlProc, case: str, data: bytes, says: str
) -> None:
    status, headers, body = _raw(control_plane.http_port, data)
    assert status in (400, 413, 414, 431), case
    assert headers.get("content-type", "").startswith("application/json"), (case, headers, body)
    assert len(headers.get("x-request-id", "")) >= 16, (case, headers)
    answer = json.loads(body)
    assert answer["code"] == 3 and says in answer["message"], (case, answer)
    assert SECRET not in answer["message"] and "install" not in answer["message"].lower(), (case, answer)


def test_expect_continue_is_refused_before_a_body_over_the_limit_is_sent(control_plane: ControlProc) -> None:
    # Given a client that asks before sending a body whose Content-Length is over the limit (64 MiB)
    with socket.create_connection(("127.0.0.1", control_plane.http_port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
            b"Content-Length: 100000000\r\n\r\n"
        )
        first = sock.recv(65536)
    # Then it is told no at once (not "100 Continue", which has it send 100 MB to be refused)
    assert first.startswith(b"HTTP/1.1 400"), first[:200]
    assert b"larger than" in first and b"100 Continue" not in first


def test_expect_continue_within_the_limit_goes_on_as_usual(control_plane: ControlProc) -> None:
    body = b'{"type": "noop"}'
    with socket.create_connection(("127.0.0.1", control_plane.http_port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
            b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
        )
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["job"]["type"] == "noop"
