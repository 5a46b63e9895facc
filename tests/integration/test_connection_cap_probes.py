"""Probes and metrics are served when other connections fill CORRAL_HTTP_MAX_CONNECTIONS.

Before, long-lived REST watch streams that took every connection of the cap made /healthz, /readyz and
/metrics answer 503 too: a Kubernetes liveness probe would then restart a healthy control plane. Now a
small reserve past the cap serves those paths only; anything else there is still answered 503 with
Retry-After, and once the reserve is taken too, a connection is answered 503 at once."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from control.gateway.connections import PROBE_HEADER_SEC, PROBE_RESERVE
from tests.conftest import ControlProc

CAP = 5
PATIENCE = 20.0
"""How long an answer is waited for (a hang guard, not a bound)."""


def _request(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, str | None, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=PATIENCE)
    try:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, resp.getheader("Retry-After"), data if path == "/metrics" else json.loads(data)
    finally:
        conn.close()


@pytest.fixture
def watched_full(make_control_plane: Callable[..., ControlProc]) -> Iterator[ControlProc]:
    """A control plane whose CAP connections are all held by REST watch streams (a job that never ends:
    no worker runs it)."""
    cp = make_control_plane(CORRAL_HTTP_MAX_CONNECTIONS=CAP)
    status, _, answer = _request(cp.http_port, "POST", "/v1/jobs", b'{"type": "noop"}')
    assert status == 200, answer
    job_id = answer["job"]["id"]
    streams = []
    try:
        for _ in range(CAP):
            sock = socket.create_connection(("127.0.0.1", cp.http_port))
            sock.settimeout(PATIENCE)
            sock.sendall(f"GET /v1/jobs/{job_id}:watch HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            assert sock.recv(4096).startswith(b"HTTP/1.1 200"), "the watch stream should open"
            streams.append(sock)
        yield cp
    finally:
        for sock in streams:
            sock.close()


def test_probes_and_metrics_are_served_while_watch_streams_hold_the_cap(watched_full: ControlProc) -> None:
    port = watched_full.http_port
    # Given every connection of the cap held by a watch stream
    # Then liveness, readiness (its own answer: no worker yet) and metrics are answered, time after time
    for _ in range(PROBE_RESERVE + 2):  # each on a connection of its own, closed after it: the reserve frees up
        assert _request(port, "GET", "/healthz")[::2] == (200, {"status": "SERVING"})
    status, _, ready = _request(port, "GET", "/readyz")
    assert (status, ready["status"]) == (503, "NOT_SERVING") and "too many" not in json.dumps(ready)
    status, _, metrics = _request(port, "GET", "/metrics")
    assert status == 200 and b"corral_http_requests_total" in metrics
    # and the REST bridge is still refused for the cap, with when to come back
    status, retry_after, answer = _request(port, "GET", "/v1/stats")
    assert (status, retry_after, answer["code"]) == (503, "1", 14), answer
    assert "too many HTTP connections" in answer["message"]


def test_over_the_cap_a_silent_connection_is_told_503_and_the_reserve_has_a_bound(watched_full: ControlProc) -> None:
    port = watched_full.http_port
    silent = []
    try:
        # Given the reserve taken by connections that say nothing
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(PROBE_RESERVE)]
        # When one more comes, Then it is told 503 at once, before it sends anything
        extra = socket.create_connection(("127.0.0.1", port))
        silent.append(extra)
        extra.settimeout(PATIENCE)
        start = time.monotonic()
        assert extra.recv(4096).startswith(b"HTTP/1.1 503"), "the connection past the reserve is refused"
        assert time.monotonic() - start < PROBE_HEADER_SEC
        # and the silent ones of the reserve are told 503 once PROBE_HEADER_SEC has passed, then closed
        first = silent[0]
        first.settimeout(PATIENCE)
        answer = first.recv(4096)
        assert answer.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in answer
        assert time.monotonic() - start < PROBE_HEADER_SEC + PATIENCE / 2
        # after which probes are served again
        deadline = time.monotonic() + PATIENCE
        while _request(port, "GET", "/healthz")[0] != 200:
            assert time.monotonic() < deadline, "/healthz should be served once the reserve frees up"
    finally:
        for sock in silent:
            sock.close()
