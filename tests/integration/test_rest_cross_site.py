"""What a web page in the user's browser can make of a control plane on 127.0.0.1 with auth off (the
default of ``corral up``), against a real control plane over HTTP:

* CSRF: a page on another site may have the browser POST to the port (``mode: "no-cors"``, a
  ``<form enctype=text/plain>``); the browser says where it comes from in ``Origin``. A request with an
  ``Origin`` that is not this server is refused (403) before anything is parsed or called; one without
  ``Origin`` (curl, scripts, clients) is served as before, whatever its Content-Type.
* DNS rebinding: a page on a name that resolves to 127.0.0.1 is same-origin to the browser, and could
  read answers; bound to a loopback address, the server refuses a ``Host`` that is not a loopback name
  (421 Misdirected Request).
* Every REST answer, a login's token and a job's payload among them, is ``Cache-Control: no-store``.
* A request the HTTP parser cannot read (a header over 8 KiB, 300 headers) is a 400 logged as one
  warning line without a traceback, not an error with aiohttp's traceback for each.
"""

from __future__ import annotations

import http.client
import json
import secrets
import socket
from dataclasses import dataclass
from typing import Any

import pytest

from tests.conftest import ControlProc, wait_until

PERMISSION_DENIED = 7
EVIL = "https://evil.example"


@dataclass
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def call(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    host: str | None = None,
) -> Answer:
    """One request as a browser or curl would send it: only the headers given (no Content-Type unless
    given), ``Host`` as given (else ``127.0.0.1:port``)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host if host is not None else f"127.0.0.1:{port}")
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        return Answer(resp.status, resp.headers, resp.read())
    finally:
        conn.close()


def submit(port: int) -> str:
    """A job that stays PENDING (no worker): its id."""
    reply = call(port, "POST", "/v1/jobs", b'{"type": "noop", "payload": {"secret": "s3cr3t"}}')
    assert reply.status == 200, reply.body
    job_id: str = reply.json()["job"]["id"]
    return job_id


def state(port: int, job_id: str) -> str:
    reply = call(port, "GET", f"/v1/jobs/{job_id}")
    assert reply.status == 200, reply.body
    value: str = reply.json()["state"]
    return value


def assert_refused(reply: Answer, status: int, says: str) -> None:
    """The bridge's error shape: google.rpc.Status JSON, a request id, not stored."""
    assert reply.status == status, reply.body
    assert reply.headers["Content-Type"].startswith("application/json")
    assert len(reply.headers.get("X-Request-ID", "")) >= 16
    assert reply.headers.get("Cache-Control") == "no-store"
    answer = reply.json()
    assert answer["code"] == PERMISSION_DENIED, answer
    assert says in answer["message"], answer


# ---- CSRF --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "origin",
    [EVIL, "null", "http://127.0.0.1:1", "https://127.0.0.1:{port}", "http://localhost:{port}", "http://x y"],
)
def test_a_post_from_another_origin_is_refused_and_changes_nothing(control_plane: ControlProc, origin: str) -> None:
    port = control_plane.http_port
    job_id = submit(port)
    # When a page elsewhere has the browser POST cancelMany, as text/plain (no preflight)
    headers = {"Origin": origin.format(port=port), "Content-Type": "text/plain"}
    reply = call(port, "POST", "/v1/jobs:cancelMany", b'{"all": true}', headers)
    # Then it is refused, saying why, and the job is not cancelled
    assert_refused(reply, 403, "cross-site request refused")
    assert "Origin" in reply.json()["message"]
    assert state(port, job_id) == "PENDING"
    # nor does a form's POST submit a job
    form = call(port, "POST", "/v1/jobs", b'{"type": "noop"}', headers)
    assert_refused(form, 403, "cross-site request refused")
    assert call(port, "GET", "/v1/jobs").json()["total"] == "1"


def test_same_origin_and_no_origin_posts_are_served(control_plane: ControlProc) -> None:
    port = control_plane.http_port
    first, second, third = submit(port), submit(port), submit(port)
    # The dashboard: Origin names the server as its Host does (a default port may be left out of neither)
    same = {"Origin": f"http://127.0.0.1:{port}", "Content-Type": "application/json"}
    assert call(port, "POST", f"/v1/jobs/{first}:cancel", b"{}", same).status == 200
    by_name = {"Origin": f"http://LocalHost:{port}"}
    assert call(port, "POST", f"/v1/jobs/{second}:cancel", b"{}", by_name, host=f"localhost:{port}").status == 200
    # curl -XPOST ... -d '{...}': no Origin, no Content-Type (curl would say form-urlencoded)
    plain = call(port, "POST", f"/v1/jobs/{third}:cancel", b"{}", {"Content-Type": "application/x-www-form-urlencoded"})
    assert plain.status == 200, plain.body
    assert [state(port, j) for j in (first, second, third)] == ["CANCELLED"] * 3
    # A read with another Origin is served (the browser keeps its answer from the page: no CORS headers)
    read = call(port, "GET", "/v1/stats", headers={"Origin": EVIL})
    assert read.status == 200 and "Access-Control-Allow-Origin" not in read.headers


# ---- DNS rebinding -----------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/stats", "/ui", "/metrics"])
def test_a_host_that_is_not_loopback_is_refused_on_a_loopback_bind(control_plane: ControlProc, path: str) -> None:
    port = control_plane.http_port
    submit(port)
    for host in (f"rebind.evil.example:{port}", "rebind.evil.example", "10.0.0.1", f"localhost.evil.example:{port}"):
        reply = call(port, "GET", path, host=host)
        assert_refused(reply, 421, "not a loopback name")
        assert b"s3cr3t" not in reply.body


def test_loopback_hosts_are_served_on_a_loopback_bind(control_plane: ControlProc) -> None:
    port = control_plane.http_port
    for host in (f"127.0.0.1:{port}", "127.0.0.1", f"localhost:{port}", f"[::1]:{port}", "127.8.9.10", "app.localhost"):
        reply = call(port, "GET", "/v1/stats", host=host)
        assert reply.status == 200, (host, reply.body)


# ---- Cache-Control -----------------------------------------------------------------------------------
def test_every_rest_answer_is_not_stored(control_plane: ControlProc) -> None:
    port = control_plane.http_port
    job_id = submit(port)
    answers = {
        "a job and its payload": call(port, "GET", f"/v1/jobs/{job_id}"),
        "a list": call(port, "GET", "/v1/jobs"),
        "a submission": call(port, "POST", "/v1/jobs", b'{"type": "noop"}'),
        "a 404": call(port, "GET", "/v1/nowhere"),
        "a 400": call(port, "POST", "/v1/jobs", b"{"),
        "a 405": call(port, "DELETE", "/v1/stats"),
        "a login (accounts off)": call(port, "POST", "/v1/login", b'{"name": "a", "password": "p"}'),
    }
    for what, reply in answers.items():
        assert reply.headers.get("Cache-Control") == "no-store", (what, reply.status, dict(reply.headers))
    unreadable = _raw(port, b"GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Foo: " + b"a" * 9000 + b"\r\n\r\n")
    assert b"\r\nCache-Control: no-store\r\n" in unreadable.partition(b"\r\n\r\n")[0] + b"\r\n", unreadable[:300]
    # and a watch stream, which ends when the job does
    assert call(port, "POST", f"/v1/jobs/{job_id}:cancel", b"{}").status == 200
    watch = call(port, "GET", f"/v1/jobs/{job_id}:watch")
    assert watch.status == 200 and watch.headers.get("Cache-Control") == "no-store"


def test_a_login_and_its_token_are_not_stored(make_control_plane: Any) -> None:
    cp = make_control_plane(
        CORRAL_ACCOUNTS="open", CORRAL_WORKER_TOKEN=secrets.token_hex(16), CORRAL_PASSWORD_ROUNDS="10"
    )
    port = cp.http_port
    account = {"name": "alice", "password": "correct horse battery"}
    assert call(port, "POST", "/v1/accounts", json.dumps(account).encode()).status == 200
    login = call(port, "POST", "/v1/login", json.dumps(account).encode())
    assert login.status == 200 and login.json().get("token"), login.body
    assert login.headers.get("Cache-Control") == "no-store"
    refused = call(port, "GET", "/v1/jobs")  # 401 without the token
    assert refused.status == 401 and refused.headers.get("Cache-Control") == "no-store"


# ---- requests the parser cannot read -----------------------------------------------------------------
def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _lines(cp: ControlProc) -> list[dict[str, Any]]:
    return [json.loads(line) for line in cp.log.read_text().splitlines() if line.startswith("{")]


def test_unreadable_requests_are_a_400_and_a_warning_without_a_traceback(control_plane: ControlProc) -> None:
    port = control_plane.http_port
    unreadable = [
        b"GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Foo: " + b"a" * 9000 + b"\r\n\r\n",
        b"GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(300)) + b"\r\n",
        b"GET /v1/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Bar: " + b"b" * 9000 + b"\r\n\r\n",
    ]
    # When requests with a header over 8 KiB, or 300 headers, come
    for data in unreadable:
        answer = _raw(port, data)
        assert answer.startswith(b"HTTP/1.") and b" 400 " in answer.split(b"\r\n")[0], answer[:200]
    # Then the log says so in one warning line (the first; the next ones in the minute at debug level),
    # with neither a traceback nor the client's bytes, and nothing at error level
    warned = wait_until(
        lambda: [line for line in _lines(control_plane) if line.get("event") == "http_request_unreadable"],
        what="the warning about the unreadable requests",
    )
    assert len(warned) == 1 and warned[0]["level"] == "warning", warned
    assert "8190" in warned[0]["reason"] or "header" in warned[0]["reason"].lower(), warned
    log = control_plane.log.read_text()
    assert "Traceback" not in log and "LineTooLong" not in log and "aaaaaaaa" not in log
    assert [line for line in _lines(control_plane) if line["level"] in ("error", "critical")] == []
